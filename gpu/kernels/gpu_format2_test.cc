// The GPU path's format-2 apply, the pinned staging upload and
// tensor-parallel shard apply, end to end against the CPU codec. Device
// tests skip with the probe's reason where there is no GPU; the host parts
// run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "gpu/host/patch_walk.h"
#include "gpu/host/shard_plan.h"
#include "gpu/kernels/apply_internal.h"
#include "gpu/kernels/test_util.h"
#include "patch/golden_cases.h"
#include "patch/test_util.h"
#include "tern/digest.h"
#include "tern/gpu.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern {
namespace {

using namespace gpu_test;

TEST(GpuPatchWalk, FindsEveryRecordOfFormat2Patches) {
  std::mt19937_64 rng(21);
  ThreadPool pool(2);
  uint64_t context_total = 0;
  for (double push : {0.001, 0.01, 0.1}) {
    testing::OwnedView a = PhysicalView(rng, 40000);
    testing::OwnedView b = testing::PhysicalStep(a, push, rng);
    uint64_t context_records = 0;
    auto patch = DiffFormat2(a, b, 4096, pool, &context_records);
    ASSERT_TRUE(patch.ok()) << patch.status().ToString();
    context_total += context_records;
    auto walked = gpu::WalkPatch(*patch);
    ASSERT_TRUE(walked.ok()) << walked.status().ToString();
    auto info = Inspect(*patch);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->format_version, 2);
    uint64_t records = 0, context = 0;
    for (const auto& t : info->tensors) records += t.segments;
    ASSERT_EQ(walked->records.size(), records);
    for (const auto& r : walked->records) context += r.h.encoding == 3;
    EXPECT_EQ(context, context_records);
  }
  EXPECT_GT(context_total, 10u) << "the views must make CONTEXT records";
}

// Format 2: CONTEXT records decode against the view on the device. Golden
// files first (frozen bytes), then physical steps at three densities, with
// one batch and with many (the write pass then decodes batch b after the
// batches before it have written).
TEST(GpuDevice, ApplyOfFormat2MatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(22);
  ThreadPool pool(2);
  for (const golden::GoldenCase& c : golden::Cases()) {
    const std::string stem = std::string(TERN_GOLDEN_DIR) + "/" + c.file;
    const std::vector<uint8_t> base = ReadFile(stem + ".base"), target = ReadFile(stem + ".target"),
                               patch = ReadFile(stem + ".patch");
    testing::OwnedView a;
    for (const auto& t : c.tensors) a.Add(t.name, t.dtype, t.shape);
    uint64_t at = 0;
    for (auto& bytes : a.data) {
      ASSERT_LE(at + bytes.size(), base.size());
      std::copy(base.begin() + at, base.begin() + at + bytes.size(), bytes.begin());
      at += bytes.size();
    }
    DeviceView d(a.View());
    const Status s = GpuApply(d.view, patch, ComputeDigest(a.View(), pool), {}, nullptr);
    ASSERT_TRUE(s.ok()) << c.file << ": " << s.ToString();
    std::vector<uint8_t> got;
    for (size_t t = 0; t < a.descs.size(); ++t) {
      const std::vector<uint8_t> part = d.Download(t);
      got.insert(got.end(), part.begin(), part.end());
    }
    ASSERT_EQ(got, target) << c.file;
  }
  for (double push : {0.0005, 0.01, 0.2}) {
    for (uint64_t scratch : {uint64_t{256} << 20, uint64_t{1} << 16}) {
      testing::OwnedView a = PhysicalView(rng, 60000);
      testing::OwnedView b = testing::PhysicalStep(a, push, rng);
      uint64_t context_records = 0;
      auto patch = DiffFormat2(a, b, 4099, pool, &context_records);
      ASSERT_TRUE(patch.ok()) << patch.status().ToString();
      EXPECT_GT(context_records, 0u) << "push " << push;
      DeviceView d(a.View());
      GpuOptions go;
      go.scratch_bytes = scratch;
      ViewDigest out;
      const Status s = GpuApply(d.view, *patch, ComputeDigest(a.View(), pool), go, &out);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(out, ComputeDigest(b.View(), pool));
      for (size_t t = 0; t < b.descs.size(); ++t)
        ASSERT_EQ(d.Download(t), b.data[t]) << "tensor " << t << " push " << push << " scratch " << scratch;
    }
  }
}

// A format-2 patch applied to a view that is not its base but claims the
// base digest: CONTEXT classes come out wrong, so the device refuses
// (decode error or target digest), and the view stays as it was.
TEST(GpuDevice, ApplyOfFormat2OnAWrongBaseLeavesTheViewUntouched) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(23);
  ThreadPool pool(2);
  testing::OwnedView a = PhysicalView(rng, 30000);
  testing::OwnedView b = testing::PhysicalStep(a, 0.01, rng);
  testing::OwnedView c = testing::PhysicalStep(a, 0.05, rng);  // not the base
  uint64_t context_records = 0;
  auto patch = DiffFormat2(a, b, 2048, pool, &context_records);
  ASSERT_TRUE(patch.ok());
  ASSERT_GT(context_records, 0u);
  DeviceView d(c.View());
  const Status s = GpuApply(d.view, *patch, ComputeDigest(a.View(), pool), {}, nullptr);
  EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
  for (size_t t = 0; t < c.descs.size(); ++t) ASSERT_EQ(d.Download(t), c.data[t]);
}

TEST(GpuProbe, StagingUploadWithoutADeviceIsUnavailable) {
  if (ProbeGpu().devices > 0) GTEST_SKIP() << "a GPU is present";
  int x = 0;
  auto up = GpuStagingUpload::Create(&x, 4, 2, 4, {});
  EXPECT_EQ(up.status().code(), Code::kUnavailable);
}

// A stream through 3 pinned slots of odd size (many wraps, back-pressure on
// every Acquire after the third), received in place (Acquire/Submit) and
// pushed; then the device bytes equal the stream.
TEST(GpuDevice, StagingUploadDeliversTheStream) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(24);
  std::vector<uint8_t> stream((uint64_t{3} << 20) + 12345);
  testing::FillRandom(stream, rng);
  void* dst = nullptr;
  ASSERT_CUDA(cudaMalloc(&dst, stream.size()));
  cudaStream_t cs;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  {
    GpuOptions go;
    go.stream = cs;
    auto up = GpuStagingUpload::Create(dst, stream.size(), 3, 65537, go);
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    uint64_t at = 0;
    while (at < stream.size() / 2) {  // received in place
      auto slot = (*up)->Acquire();
      ASSERT_TRUE(slot.ok()) << slot.status().ToString();
      const uint64_t n = std::min<uint64_t>({slot->size(), 1 + rng() % 70000, stream.size() - at});
      std::memcpy(slot->data(), stream.data() + at, n);
      ASSERT_TRUE((*up)->Submit(n).ok());
      at += n;
      ASSERT_LE((*up)->bytes_done(), at);
    }
    ASSERT_TRUE((*up)->Push({stream.data() + at, stream.size() - at}).ok());
    ASSERT_TRUE((*up)->Drain().ok());
    EXPECT_EQ((*up)->bytes_done(), stream.size());
    EXPECT_EQ((*up)->Push({stream.data(), 1}).code(), Code::kResourceExhausted);  // past the destination
  }
  std::vector<uint8_t> back(stream.size());
  ASSERT_CUDA(cudaMemcpy(back.data(), dst, back.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, stream);
  ASSERT_CUDA(cudaStreamDestroy(cs));
  ASSERT_CUDA(cudaFree(dst));
}

// ---- Tensor-parallel shards, an island simulated on one GPU ------------------

// The island's all-reduce between threads (one per simulated rank): each
// call k of every rank adds into sums_[k], waits for all, reads the total.
class HostAllReduce {
 public:
  explicit HostAllReduce(int n) : barrier_(n) {}
  Status Run(int rank, uint64_t* dev, uint64_t count, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    std::vector<uint64_t> mine(count);
    if (cudaMemcpyAsync(mine.data(), dev, count * 8, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess)
      return Status(Code::kInternal, "host all-reduce: copy");
    const size_t k = calls_[rank]++;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (sums_.size() <= k) sums_.resize(k + 1);
      if (sums_[k].empty()) sums_[k].assign(count, 0);
      for (uint64_t i = 0; i < count; ++i) sums_[k][i] += mine[i];
    }
    barrier_.arrive_and_wait();
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine = sums_[k];
    }
    if (cudaMemcpyAsync(dev, mine.data(), count * 8, cudaMemcpyHostToDevice, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess)
      return Status(Code::kInternal, "host all-reduce: copy back");
    return Status::Ok();
  }

 private:
  std::barrier<> barrier_;
  std::mutex mu_;
  std::vector<std::vector<uint64_t>> sums_;
  std::map<int, size_t> calls_ = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};
};

// Rank r's block of every tensor of v, row-major (gpu/host/shard_plan.h).
std::vector<std::vector<uint8_t>> ShardBytes(const testing::OwnedView& v, const std::vector<gpu::TpShard>& shards) {
  std::vector<std::vector<uint8_t>> out;
  for (size_t t = 0; t < v.descs.size(); ++t) {
    const int w = ElementBits(v.descs[t].dtype);
    std::vector<uint8_t> b(std::max<uint64_t>(DTypeBytes(v.descs[t].dtype, shards[t].elements), 1));
    for (uint64_t k = 0; k < shards[t].elements; ++k)
      gpu::StoreElement(b.data(), k, w, gpu::LoadElement(v.data[t].data(), gpu::ShardGlobalIndex(shards[t].block, k), w));
    out.push_back(std::move(b));
  }
  return out;
}

// Every simulated rank applies its shards; returns each rank's status and
// checks every rank's shards against `want` (the target, or the base when
// the island refuses).
std::vector<Status> RunIsland(const testing::OwnedView& base, const testing::OwnedView& want,
                              const std::vector<GpuTpSplit>& splits, int nranks, std::span<const uint8_t> patch,
                              const ViewDigest& digest, uint64_t scratch) {
  HostAllReduce reduce(nranks);
  std::vector<Status> result(nranks, Status::Ok());
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      gpu::ShardedApply sh;
      for (size_t t = 0; t < splits.size(); ++t) sh.shards.push_back(*gpu::ShardOf(base.descs[t], splits[t], nranks, r));
      sh.all_reduce = [&, r](uint64_t* d, uint64_t n, void* st) { return reduce.Run(r, d, n, st); };
      const auto host = ShardBytes(base, sh.shards);
      std::vector<void*> bufs;
      MutableServeView mv;
      for (size_t t = 0; t < host.size(); ++t) {
        void* p = nullptr;
        EXPECT_EQ(cudaMalloc(&p, host[t].size()), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(p, host[t].data(), host[t].size(), cudaMemcpyHostToDevice), cudaSuccess);
        bufs.push_back(p);
        mv.tensors.push_back({&base.descs[t], static_cast<uint8_t*>(p)});
      }
      cudaStream_t stream;
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      GpuOptions go;
      go.stream = stream;
      go.scratch_bytes = scratch;
      result[r] = gpu::ApplyOnDevice(mv, patch, digest, go, nullptr, &sh);
      const auto expect = ShardBytes(want, sh.shards);
      for (size_t t = 0; t < bufs.size(); ++t) {
        std::vector<uint8_t> got(host[t].size());
        EXPECT_EQ(cudaMemcpy(got.data(), bufs[t], got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(got, expect[t]) << "rank " << r << " tensor " << t;
        cudaFree(bufs[t]);
      }
      cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  return result;
}

testing::OwnedView TpView(std::mt19937_64& rng) {
  testing::OwnedView v;
  v.Add("a.bf16", DType::kBF16, {64, 96});  // column-parallel weight: rows
  v.Add("b.f4", DType::kF4, {32, 64});      // row-parallel weight: columns
  v.Add("c.f32", DType::kF32, {64});        // its bias: rows
  v.Add("d.f16", DType::kF16, {96});        // a norm: replicated
  v.Add("e.u8", DType::kU8, {16, 40});      // columns
  for (size_t t = 0; t < v.descs.size(); ++t) testing::PhysicalFill(v.data[t], v.descs[t].dtype, v.descs[t].elements(), rng);
  return v;
}
const std::vector<GpuTpSplit> kTpSplits = {GpuTpSplit::kRows, GpuTpSplit::kCols, GpuTpSplit::kRows,
                                           GpuTpSplit::kReplicated, GpuTpSplit::kCols};

TEST(GpuDevice, ShardedIslandAppliesEachRanksShare) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(25);
  ThreadPool pool(2);
  for (int nranks : {1, 2, 4}) {
    for (double push : {0.001, 0.05}) {
      for (uint64_t scratch : {uint64_t{256} << 20, uint64_t{1} << 12}) {
        testing::OwnedView a = TpView(rng);
        testing::OwnedView b = testing::PhysicalStep(a, push, rng);
        DiffOptions opt;
        opt.segment_elements = 1000;  // straddles shards: format 1 maps change by change
        opt.format_version = 1;
        auto patch = Diff(a.View(), b.View(), opt, pool);
        ASSERT_TRUE(patch.ok());
        for (const Status& s : RunIsland(a, b, kTpSplits, nranks, *patch, ComputeDigest(a.View(), pool), scratch))
          EXPECT_TRUE(s.ok()) << s.ToString() << " ranks " << nranks;
      }
    }
  }
}

TEST(GpuDevice, ShardedIslandRefusesTogether) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(26);
  ThreadPool pool(2);
  testing::OwnedView a = TpView(rng);
  testing::OwnedView b = testing::PhysicalStep(a, 0.05, rng);
  const ViewDigest da = ComputeDigest(a.View(), pool);
  // A format-2 patch whose CONTEXT segments straddle the shards: kUnsupported
  // on the ranks that see one, kCancelled on the others; nothing written.
  DiffOptions opt;
  opt.segment_elements = 1000;
  opt.format_version = 2;
  opt.nibble_coding = false;
  auto p2 = Diff(a.View(), b.View(), opt, pool);
  ASSERT_TRUE(p2.ok());
  int unsupported = 0;
  for (const Status& s : RunIsland(a, a, kTpSplits, 2, *p2, da, uint64_t{256} << 20)) {
    EXPECT_FALSE(s.ok());
    unsupported += s.code() == Code::kUnsupported;
  }
  EXPECT_GT(unsupported, 0);
  // A wrong digest change (the patch of another step claiming this base): every rank refuses.
  opt.format_version = 1;
  testing::OwnedView c = testing::PhysicalStep(a, 0.05, rng);
  auto p1 = Diff(a.View(), b.View(), opt, pool);
  ASSERT_TRUE(p1.ok());
  for (const Status& s : RunIsland(c, c, kTpSplits, 2, *p1, da, uint64_t{256} << 20))
    EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
}

}  // namespace
}  // namespace tern
