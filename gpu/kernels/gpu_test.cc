// The GPU path end to end: device results against the CPU codec and
// quantizers, bit for bit. Tests that need a device skip with the probe's
// reason where there is none; the host parts (the patch walk, the probe,
// loading NCCL) run everywhere.
#include "tern/gpu.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "base/coding.h"
#include "base/hash.h"
#include "gpu/host/patch_walk.h"
#include "gpu/kernels/test_util.h"
#include "patch/segment_codec.h"
#include "patch/test_util.h"
#include "tern/digest.h"
#include "tern/float_cast.h"
#include "tern/patch.h"
#include "tern/quantize.h"
#include "tern/thread_pool.h"

namespace tern {
namespace {

using namespace gpu_test;

// A view with one tensor of every element width (F4 with an odd length).
testing::OwnedView MixedView(std::mt19937_64& rng, uint64_t scale) {
  testing::OwnedView v;
  v.Add("a.f4", DType::kF4, {3 * scale + 1});
  v.Add("b.u8", DType::kU8, {2 * scale});
  v.Add("c.bf16", DType::kBF16, {16, scale / 4});
  v.Add("d.f32", DType::kF32, {scale});
  v.Add("e.u64", DType::kU64, {scale / 8 + 3});
  v.Add("f.empty", DType::kF16, {0});
  for (auto& d : v.data) testing::FillRandom(d, rng);
  return v;
}

void MutateAll(testing::OwnedView& v, double density, std::mt19937_64& rng) {
  for (size_t t = 0; t < v.descs.size(); ++t)
    testing::Mutate(v.data[t], ElementBits(v.descs[t].dtype), v.descs[t].elements(), density, rng);
}

// ---- Host parts: run everywhere ------------------------------------------------

TEST(GpuProbe, AnswersWithAReason) {
  const GpuProbe p = ProbeGpu();
  EXPECT_TRUE(p.built_with_cuda);
  if (p.devices == 0) {
    EXPECT_FALSE(p.reason.empty());
  }
  std::cout << "GPU probe: " << p.devices << " device(s) " << p.device_name << " " << p.reason << "\n";
}

TEST(GpuProbe, CallsWithoutADeviceAreUnavailable) {
  if (ProbeGpu().devices > 0) GTEST_SKIP() << "a GPU is present";
  std::mt19937_64 rng(1);
  testing::OwnedView a = MixedView(rng, 64);
  ServeView v = a.View();
  EXPECT_EQ(GpuComputeDigest(v, {}).status().code(), Code::kUnavailable);
}

TEST(GpuPatchWalk, FindsEveryRecordOfValidPatches) {
  std::mt19937_64 rng(2);
  ThreadPool pool(2);
  for (double density : {0.0, 0.001, 0.05, 1.0}) {
    testing::OwnedView a = MixedView(rng, 4096), b(a.View());
    MutateAll(b, density, rng);
    DiffOptions opt;
    opt.segment_elements = 1000;
    opt.base_version = 7;
    opt.target_version = 8;
    opt.nibble_coding = false;  // the GPU apply takes versions 1 and 2 (patch_walk.cc)
    auto patch = Diff(a.View(), b.View(), opt, pool);
    ASSERT_TRUE(patch.ok());
    auto walked = gpu::WalkPatch(*patch);
    ASSERT_TRUE(walked.ok()) << walked.status().ToString();
    auto info = Inspect(*patch);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(walked->base_version, 7u);
    EXPECT_EQ(walked->target_digest, info->target_digest);
    ASSERT_EQ(walked->tensors.size(), info->tensors.size());
    uint64_t records = 0;
    for (size_t t = 0; t < info->tensors.size(); ++t) {
      EXPECT_EQ(walked->tensors[t].desc.name, info->tensors[t].name);
      EXPECT_EQ(walked->tensors[t].desc.shape, info->tensors[t].shape);
      EXPECT_EQ(walked->tensors[t].segment_count, info->tensors[t].segments);
      records += info->tensors[t].segments;
    }
    ASSERT_EQ(walked->records.size(), records);
    uint64_t changed = 0;
    for (const auto& r : walked->records) changed += r.h.changed_count;
    EXPECT_EQ(changed, info->changed_elements);
  }
}

TEST(GpuPatchWalk, RejectsDamagedAndTruncatedPatches) {
  std::mt19937_64 rng(3);
  ThreadPool pool(2);
  testing::OwnedView a = MixedView(rng, 1024), b(a.View());
  MutateAll(b, 0.01, rng);
  auto patch = Diff(a.View(), b.View(), DiffOptions{.nibble_coding = false}, pool);
  ASSERT_TRUE(patch.ok());
  for (size_t at : {size_t{3}, size_t{40}, patch->size() / 2, patch->size() - 1}) {
    std::vector<uint8_t> bad = *patch;
    bad[at] ^= 0x10;
    EXPECT_EQ(gpu::WalkPatch(bad).status().code(), Code::kCorrupt) << at;
  }
  std::vector<uint8_t> cut(patch->begin(), patch->end() - 1);
  EXPECT_EQ(gpu::WalkPatch(cut).status().code(), Code::kCorrupt);
}

TEST(GpuNccl, LoadsAtRunTimeOrSaysWhy) {
  auto v = NcclIsland::LibraryVersion();
  if (v.ok()) {
    EXPECT_GE(*v, 20000);
    std::cout << "NCCL " << *v << "\n";
  } else {
    EXPECT_EQ(v.status().code(), Code::kUnavailable);
    EXPECT_NE(v.status().message().find("NCCL"), std::string::npos);
  }
  EXPECT_EQ(NcclIsland::Join(2, 2, std::vector<uint8_t>(128)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(NcclIsland::Join(2, 0, std::vector<uint8_t>(5)).status().code(), Code::kInvalidArgument);
}

// ---- Device: equivalence with the CPU reference ------------------------------

TEST(GpuDevice, DigestMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(4);
  ThreadPool pool(2);
  testing::OwnedView a = MixedView(rng, 100000);
  DeviceView d(a.View());
  auto got = GpuComputeDigest(AsConst(d.view), {});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, ComputeDigest(a.View(), pool));
}

TEST(GpuDevice, ApplyMatchesCpuAtEveryDensity) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  ThreadPool pool(2);
  for (double density : {0.0, 0.0001, 0.01, 0.3, 1.0}) {
    for (uint64_t scratch : {uint64_t{256} << 20, uint64_t{1} << 16}) {  // one batch, many batches
      testing::OwnedView a = MixedView(rng, 50000), b(a.View());
      MutateAll(b, density, rng);
      DiffOptions opt;
      opt.segment_elements = 4099;
      opt.nibble_coding = false;
      auto patch = Diff(a.View(), b.View(), opt, pool);
      ASSERT_TRUE(patch.ok());
      DeviceView d(a.View());
      GpuOptions go;
      go.scratch_bytes = scratch;
      cudaStream_t stream = nullptr;  // a stream of our own for the small-scratch runs
      if (scratch < (uint64_t{1} << 20)) {
        ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      }
      go.stream = stream;
      ViewDigest out;
      const Status s = GpuApply(d.view, *patch, ComputeDigest(a.View(), pool), go, &out);
      if (stream != nullptr) {
        ASSERT_CUDA(cudaStreamDestroy(stream));
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(out, ComputeDigest(b.View(), pool));
      for (size_t t = 0; t < b.descs.size(); ++t)
        ASSERT_EQ(d.Download(t), b.data[t]) << "tensor " << t << " density " << density << " scratch " << scratch;
    }
  }
}

TEST(GpuDevice, ApplyRefusesAndLeavesTheViewUntouched) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(6);
  ThreadPool pool(2);
  testing::OwnedView a = MixedView(rng, 20000), b(a.View()), c(a.View());
  MutateAll(b, 0.01, rng);
  MutateAll(c, 0.001, rng);
  auto patch = Diff(a.View(), b.View(), DiffOptions{.nibble_coding = false}, pool);
  ASSERT_TRUE(patch.ok());
  const ViewDigest da = ComputeDigest(a.View(), pool);
  // Wrong base digest: refused before any work.
  {
    DeviceView d(a.View());
    EXPECT_EQ(GpuApply(d.view, *patch, ComputeDigest(c.View(), pool), {}).code(), Code::kMismatch);
  }
  // A view that is not the base but claims to be: the target digest catches
  // it, and nothing was written.
  {
    DeviceView d(c.View());
    EXPECT_EQ(GpuApply(d.view, *patch, da, {}).code(), Code::kCorrupt);
    for (size_t t = 0; t < c.descs.size(); ++t) ASSERT_EQ(d.Download(t), c.data[t]);
  }
}

// Damages the streams of one record so that patch/'s decoder rejects it,
// then re-seals the record and trailer checksums: only decoding can tell.
std::vector<uint8_t> BreakOneRecordsStreams(const std::vector<uint8_t>& patch, std::mt19937_64& rng) {
  auto wp = gpu::WalkPatch(patch);
  EXPECT_TRUE(wp.ok());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    std::vector<uint8_t> out = patch;
    const size_t r = rng() % wp->records.size();
    const gpu::WalkedRecord& rec = wp->records[r];
    const uint64_t payload = rec.total_bytes - 8 - sizeof(gpu::RecordHeader);
    if (payload == 0) continue;
    out[rec.offset + sizeof(gpu::RecordHeader) + rng() % payload] ^= static_cast<uint8_t>(1u << (rng() % 8));
    patch::RecordView view{};
    std::memcpy(&view.h, out.data() + rec.offset, sizeof(view.h));
    view.table = out.data() + rec.offset + sizeof(view.h);
    view.positions = view.table + view.h.table_bytes;
    view.values = view.positions + view.h.position_bytes;
    const int w = ElementBits(wp->tensors[rec.h.tensor_index].desc.dtype);
    if (patch::DecodeRecord(view, w, [](uint64_t, uint64_t) {}).ok()) continue;
    // Re-seal: the record's checksum, then the trailer's over all of them.
    const uint64_t sum = Xxh3(out.data() + rec.offset, rec.total_bytes - 8);
    std::memcpy(out.data() + rec.offset + rec.total_bytes - 8, &sum, 8);
    const uint64_t manifest_bytes = DecodeFixed64(out.data() + 16);
    std::vector<uint8_t> t(out.end() - 24, out.end() - 8);  // magic, record count
    t.insert(t.end(), out.begin() + 32 + manifest_bytes, out.begin() + 32 + manifest_bytes + 8);
    for (const auto& x : wp->records)
      t.insert(t.end(), out.begin() + x.offset + x.total_bytes - 8, out.begin() + x.offset + x.total_bytes);
    const uint64_t trailer = Xxh3(t.data(), t.size());
    std::memcpy(out.data() + out.size() - 8, &trailer, 8);
    EXPECT_TRUE(VerifiedPrefixBytes(out).ok());
    return out;
  }
  ADD_FAILURE() << "could not break a record";
  return patch;
}

// The premise of the next test, on the CPU: the damaged patch passes every
// checksum, and only decoding rejects it.
TEST(GpuPatchWalk, BrokenStreamsPassFramingButNotDecoding) {
  std::mt19937_64 rng(12);
  ThreadPool pool(2);
  for (double density : {0.001, 0.05, 0.9}) {
    testing::OwnedView a = MixedView(rng, 20000), b(a.View());
    MutateAll(b, density, rng);
    DiffOptions opt;
    opt.segment_elements = 2000;
    opt.nibble_coding = false;
    auto patch = Diff(a.View(), b.View(), opt, pool);
    ASSERT_TRUE(patch.ok());
    const std::vector<uint8_t> bad = BreakOneRecordsStreams(*patch, rng);
    ASSERT_NE(bad, *patch);
    EXPECT_TRUE(gpu::WalkPatch(bad).ok());
    testing::OwnedView c(a.View());
    MutableServeView cv = c.Mutable();
    const Status s = Apply(cv, bad, ComputeDigest(a.View(), pool), pool);
    EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
    EXPECT_EQ(Inspect(bad).status().code(), Code::kCorrupt);
  }
}

TEST(GpuDevice, ApplyRejectsBadStreamsFoundOnlyByDecoding) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(11);
  ThreadPool pool(2);
  for (double density : {0.001, 0.05, 0.9}) {
    testing::OwnedView a = MixedView(rng, 20000), b(a.View());
    MutateAll(b, density, rng);
    DiffOptions opt;
    opt.segment_elements = 2000;
    opt.nibble_coding = false;
    auto patch = Diff(a.View(), b.View(), opt, pool);
    ASSERT_TRUE(patch.ok());
    const std::vector<uint8_t> bad = BreakOneRecordsStreams(*patch, rng);
    DeviceView d(a.View());
    const Status s = GpuApply(d.view, bad, ComputeDigest(a.View(), pool), {});
    EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
    EXPECT_NE(s.message().find("segment at element"), std::string::npos) << s.ToString();
    for (size_t t = 0; t < a.descs.size(); ++t) ASSERT_EQ(d.Download(t), a.data[t]);
    // The CPU agrees that the patch is corrupt.
    testing::OwnedView c(a.View());
    MutableServeView cv = c.Mutable();
    EXPECT_EQ(Apply(cv, bad, ComputeDigest(a.View(), pool), pool).code(), Code::kCorrupt);
  }
}

TEST(GpuDevice, RefusesViewsTheDeviceCannotAddress) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(9);
  ThreadPool pool(2);
  testing::OwnedView a = MixedView(rng, 4096), b(a.View());
  MutateAll(b, 0.01, rng);
  auto patch = Diff(a.View(), b.View(), DiffOptions{.nibble_coding = false}, pool);
  ASSERT_TRUE(patch.ok());
  const ViewDigest da = ComputeDigest(a.View(), pool);
  // Pageable host memory: refused before any kernel could fault on it.
  MutableServeView host = a.Mutable();
  EXPECT_EQ(GpuApply(host, *patch, da, {}).code(), Code::kInvalidArgument);
  EXPECT_EQ(GpuComputeDigest(a.View(), {}).status().code(), Code::kInvalidArgument);
  // A device pointer not aligned to its element size.
  DeviceView d(a.View());
  MutableServeView shifted = d.view;
  shifted.tensors[2].data += 1;  // c.bf16
  EXPECT_EQ(GpuApply(shifted, *patch, da, {}).code(), Code::kInvalidArgument);
  // And the real view still applies (nothing above broke the context).
  EXPECT_TRUE(GpuApply(d.view, *patch, da, {}).ok());
  EXPECT_EQ(d.Download(2), b.data[2]);
}

TEST(GpuDevice, DiffWritesTheCpuPatch) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  ThreadPool pool(2);
  for (double density : {0.0, 0.001, 0.01, 0.5, 1.0}) {
    testing::OwnedView a = MixedView(rng, 30000), b(a.View());
    MutateAll(b, density, rng);
    DiffOptions opt;
    opt.segment_elements = 5001;
    opt.target_version = 1;
    opt.format_version = 1;  // GpuDiff writes format 1
    auto want = Diff(a.View(), b.View(), opt, pool);
    ASSERT_TRUE(want.ok());
    DeviceView da(a.View()), db(b.View());
    GpuOptions go;
    go.scratch_bytes = density < 0.1 ? uint64_t{256} << 20 : uint64_t{1} << 18;
    auto got = GpuDiff(AsConst(da.view), AsConst(db.view), opt, go);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, *want) << "density " << density;
  }
}

TEST(GpuDevice, PublisherKeepsThePreviousViewAndWritesCpuPatches) {
  SKIP_WITHOUT_GPU();
  ThreadPool pool(2);
  for (auto keep : {GpuPublisher::Keep::kDevice, GpuPublisher::Keep::kPinnedHost}) {
    std::mt19937_64 rng(10);
    testing::OwnedView v0 = MixedView(rng, 20000);
    DeviceView live(v0.View());
    auto pub = GpuPublisher::Create(AsConst(live.view), 5, keep, {});
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    EXPECT_EQ((*pub)->digest(), ComputeDigest(v0.View(), pool));
    testing::OwnedView prev(v0.View());
    for (uint64_t version = 6; version < 9; ++version) {
      testing::OwnedView next(prev.View());
      MutateAll(next, 0.01, rng);
      for (size_t t = 0; t < next.descs.size(); ++t)  // the trainer updates its live view in place
        ASSERT_CUDA(cudaMemcpy(live.buffers[t], next.data[t].data(), next.data[t].size(), cudaMemcpyHostToDevice));
      DiffOptions opt;
      opt.base_version = version - 1;
      opt.target_version = version;
      opt.format_version = 1;  // GpuDiff writes format 1
      auto want = Diff(prev.View(), next.View(), opt, pool);
      ASSERT_TRUE(want.ok());
      auto got = (*pub)->Publish(AsConst(live.view), version, DiffOptions{});
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, *want) << "version " << version;
      EXPECT_EQ((*pub)->digest(), ComputeDigest(next.View(), pool));
      EXPECT_EQ((*pub)->version(), version);
      prev = testing::OwnedView(next.View());
    }
  }
}

// An island of one rank on one GPU: NCCL's communicator, the broadcasts and
// the apply behind ApplyFromRoot run for real (two ranks need two GPUs).
TEST(GpuDevice, IslandOfOneRankAppliesTheRootsPatch) {
  SKIP_WITHOUT_GPU();
  auto version = NcclIsland::LibraryVersion();
  if (!version.ok()) GTEST_SKIP() << version.status().ToString();
  std::mt19937_64 rng(13);
  ThreadPool pool(2);
  testing::OwnedView a = MixedView(rng, 20000), b(a.View());
  MutateAll(b, 0.01, rng);
  auto patch = Diff(a.View(), b.View(), DiffOptions{.nibble_coding = false}, pool);
  ASSERT_TRUE(patch.ok());
  auto id = NcclIsland::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto island = NcclIsland::Join(1, 0, *id);
  ASSERT_TRUE(island.ok()) << island.status().ToString();
  DeviceView d(a.View());
  ViewDigest out;
  const Status s = island->ApplyFromRoot(d.view, *patch, 0, ComputeDigest(a.View(), pool), {}, &out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out, ComputeDigest(b.View(), pool));
  for (size_t t = 0; t < b.descs.size(); ++t) ASSERT_EQ(d.Download(t), b.data[t]);
}

// Quantizes on the device and compares every output with tern::Quantize,
// for a first call and for a call with the previous state in the buffers.
void CheckQuantize(const char* format, DType master_dtype,
                   const std::vector<uint64_t>& shape = {2, 192, 256}) {
  auto spec = ParseQuantFormat(format);
  ASSERT_TRUE(spec.ok());
  std::mt19937_64 rng(8);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  uint64_t n = 1;
  for (uint64_t dim : shape) n *= dim;
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  for (uint64_t i = 0; i < 300; ++i) x[i] = 0.0f;
  void* d_master = nullptr;
  ASSERT_CUDA(cudaMalloc(&d_master, n * 4));
  std::unique_ptr<void, decltype(&cudaFree)> master_guard(d_master, &cudaFree);
  std::vector<void*> outs;
  std::vector<std::unique_ptr<void, decltype(&cudaFree)>> guards;
  Quantized prev;
  for (int step = 0; step < 2; ++step) {
    if (master_dtype == DType::kBF16) {  // the CPU reference sees the widened values
      std::vector<uint16_t> bf(n);
      CastF32ToBF16(x.data(), bf.data(), n);
      CastBF16ToF32(bf.data(), x.data(), n);
      ASSERT_CUDA(cudaMemcpy(d_master, bf.data(), n * 2, cudaMemcpyHostToDevice));
    } else {
      ASSERT_CUDA(cudaMemcpy(d_master, x.data(), n * 4, cudaMemcpyHostToDevice));
    }
    auto want = Quantize(*spec, x.data(), shape, step ? &prev : nullptr, ScalePolicy{});
    ASSERT_TRUE(want.ok());
    if (step == 0) {
      for (const QuantTensor& t : want->tensors) {
        void* p = nullptr;
        ASSERT_CUDA(cudaMalloc(&p, t.data.size()));
        outs.push_back(p);
        guards.emplace_back(p, &cudaFree);
      }
    }
    auto stats = GpuQuantize(*spec, master_dtype, d_master, shape, outs, step > 0, ScalePolicy{}, {});
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->rescaled_groups, want->rescaled_groups) << format << " step " << step;
    for (size_t k = 0; k < want->tensors.size(); ++k) {
      std::vector<uint8_t> got(want->tensors[k].data.size());
      ASSERT_CUDA(cudaMemcpy(got.data(), outs[k], got.size(), cudaMemcpyDeviceToHost));
      ASSERT_EQ(got, want->tensors[k].data) << format << " " << want->tensors[k].suffix << " step " << step;
    }
    prev = *want;
    for (uint64_t i = 0; i < n; i += 3) x[i] *= (i % 2 ? 1.04f : 0.95f);
  }
}

TEST(GpuDevice, QuantizeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const char* f : {"bf16", "fp16", "fp8-e4m3-tensor", "fp8-e4m3-channel", "fp8-e4m3-block128",
                        "fp8-e5m2-channel", "nvfp4", "nvfp4-ct", "mxfp4"}) {
    CheckQuantize(f, DType::kF32);
    CheckQuantize(f, DType::kBF16);
  }
}

// INT4 layouts are per-Linear (2-D); 180 rows leave a partial zero-point
// word, GPTQ needs rows in eights.
TEST(GpuDevice, QuantizeInt4MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const char* f : {"int4-g32", "int4-g128", "int4-g64-asym", "int4-g128-asym"}) {
    CheckQuantize(f, DType::kF32, {180, 256});
    CheckQuantize(f, DType::kBF16, {180, 256});
  }
  for (const char* f : {"gptq-int4-g32", "gptq-int4-g128"}) {
    CheckQuantize(f, DType::kF32, {192, 256});
    CheckQuantize(f, DType::kBF16, {192, 256});
  }
}

// A GPTQ scale beyond F16's range: kOutOfRange, as the CPU, and no output
// written (the scale pass writes scratch only).
TEST(GpuDevice, QuantizeInt4RefusesAnOverflowingScaleAndWritesNothing) {
  SKIP_WITHOUT_GPU();
  auto spec = ParseQuantFormat("gptq-int4-g128");
  ASSERT_TRUE(spec.ok());
  const std::vector<uint64_t> shape = {8, 256};
  std::vector<float> x(8 * 256, 0.01f);
  x[300] = 1e7f;  // scale 1.3e6 > 65504
  EXPECT_EQ(Quantize(*spec, x.data(), shape, nullptr, ScalePolicy{}).status().code(), Code::kOutOfRange);
  void* d_master = nullptr;
  ASSERT_CUDA(cudaMalloc(&d_master, x.size() * 4));
  ASSERT_CUDA(cudaMemcpy(d_master, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  const size_t sizes[4] = {256 / 8 * 8 * 4, 2 * 8 * 2, 2 * 1 * 4, 256 * 4};  // qweight, scales, qzeros, g_idx
  std::vector<void*> outs;
  for (size_t b : sizes) {
    void* p = nullptr;
    ASSERT_CUDA(cudaMalloc(&p, b));
    ASSERT_CUDA(cudaMemset(p, 0xAB, b));
    outs.push_back(p);
  }
  auto r = GpuQuantize(*spec, DType::kF32, d_master, shape, outs, false, ScalePolicy{}, {});
  EXPECT_EQ(r.status().code(), Code::kOutOfRange) << r.status().ToString();
  for (size_t k = 0; k < outs.size(); ++k) {
    std::vector<uint8_t> got(sizes[k]);
    ASSERT_CUDA(cudaMemcpy(got.data(), outs[k], got.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, std::vector<uint8_t>(sizes[k], 0xAB)) << "output " << k;
    cudaFree(outs[k]);
  }
  cudaFree(d_master);
}

TEST(GpuDevice, QuantizeRefusesNonFiniteAndWritesNothing) {
  SKIP_WITHOUT_GPU();
  auto spec = ParseQuantFormat("fp8-e4m3-block128");
  ASSERT_TRUE(spec.ok());
  std::vector<float> x(128 * 128, 0.5f);
  x[777] = NAN;
  void *m = nullptr, *codes = nullptr, *scales = nullptr;
  ASSERT_CUDA(cudaMalloc(&m, x.size() * 4));
  ASSERT_CUDA(cudaMalloc(&codes, x.size()));
  ASSERT_CUDA(cudaMalloc(&scales, 4));
  ASSERT_CUDA(cudaMemcpy(m, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(codes, 0xAB, x.size()));
  void* outs[] = {codes, scales};
  auto r = GpuQuantize(*spec, DType::kF32, m, {128, 128}, outs, false, ScalePolicy{}, {});
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("777"), std::string::npos) << r.status().ToString();
  std::vector<uint8_t> got(x.size());
  ASSERT_CUDA(cudaMemcpy(got.data(), codes, got.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, std::vector<uint8_t>(x.size(), 0xAB));
  cudaFree(m);
  cudaFree(codes);
  cudaFree(scales);
}

// More than 2^31 elements: 64-bit indexing in the digest, apply and diff.
// Changes sit beyond 2^31, where a 32-bit index would wrap.
TEST(GpuDevice, TensorsBeyondTwoToThe31Elements) {
  SKIP_WITHOUT_GPU();
  if (std::getenv("TERN_GPU_LARGE") == nullptr) GTEST_SKIP() << "set TERN_GPU_LARGE=1 (needs ~5 GB GPU, 5 GB host)";
  const uint64_t n = (uint64_t{1} << 31) + 4096 + 3;
  testing::OwnedView a;
  a.Add("big", DType::kU8, {n});
  testing::OwnedView b(a.View());
  for (uint64_t i : {uint64_t{1} << 31, (uint64_t{1} << 31) + 1, (uint64_t{1} << 31) + 4000, n - 1})
    b.data[0][i] = static_cast<uint8_t>(i % 250 + 1);
  ThreadPool pool(0);
  const ViewDigest da = ComputeDigest(a.View(), pool), db = ComputeDigest(b.View(), pool);
  DiffOptions v1;
  v1.format_version = 1;  // GpuDiff writes format 1
  auto patch = Diff(a.View(), b.View(), v1, pool, &da);
  ASSERT_TRUE(patch.ok());
  DeviceView d(a.View()), e(b.View());
  auto got_digest = GpuComputeDigest(AsConst(d.view), {});
  ASSERT_TRUE(got_digest.ok());
  EXPECT_EQ(*got_digest, da);
  auto gdiff = GpuDiff(AsConst(d.view), AsConst(e.view), v1, {}, &da);
  ASSERT_TRUE(gdiff.ok()) << gdiff.status().ToString();
  EXPECT_EQ(*gdiff, *patch);
  ViewDigest out;
  ASSERT_TRUE(GpuApply(d.view, *patch, da, {}, &out).ok());
  EXPECT_EQ(out, db);
  auto after = GpuComputeDigest(AsConst(d.view), {});
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, db);
}

}  // namespace
}  // namespace tern
