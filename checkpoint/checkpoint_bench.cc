// Checkpoint I/O costs, as ratios to a memcpy of the same bytes measured in
// the same run (docs/benchmarks.md, "Checkpoint I/O").
//
//   checkpoint_bench DIR [GiB=1] [tensors=20000]
//
// DIR must be on the file system under test; the bench writes about 2x GiB
// there and removes it. Rows:
//   create+fill+commit  Create, write every byte through the mapping, Commit (fsync)
//   open (cold header)  Open + validate a checkpoint of `tensors` small tensors
//   read (mapped)       touch every byte of the opened view (page cache hot)
//   clone+commit        CloneForWrite (copy_file_range) + Commit (fsync)
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tern/checkpoint.h"

namespace {

using WallClock = std::chrono::steady_clock;  // not tern::Clock
double Since(WallClock::time_point t0) { return std::chrono::duration<double>(WallClock::now() - t0).count(); }

// CPU seconds of this process: on a shared, oversubscribed machine wall time
// measures the neighbours as much as us.
double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int Die(const tern::Status& s) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tern;
  if (argc < 2) {
    std::fprintf(stderr, "usage: checkpoint_bench DIR [GiB=1] [tensors=20000]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const double gib = argc > 2 ? std::atof(argv[2]) : 1.0;
  const uint64_t small_count = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 20000;
  const uint64_t bytes = static_cast<uint64_t>(gib * (1 << 30)) / 4096 * 4096;
  const uint64_t per_tensor = uint64_t{64} << 20;

  // memcpy baseline on the same byte count (buffers touched first).
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  auto t0 = WallClock::now();
  double c0 = CpuNow();
  std::memcpy(b.data(), a.data(), bytes);
  const double memcpy_s = Since(t0), memcpy_cpu = CpuNow() - c0;
  if (b[bytes / 2] != 1) return 1;

  std::vector<TensorDesc> big;
  for (uint64_t at = 0, i = 0; at < bytes; at += per_tensor, ++i)
    big.push_back({"layers." + std::to_string(i) + ".w", DType::kBF16,
                   {std::min(per_tensor, bytes - at) / 2}});
  const std::string path = dir + "/bench_base";
  const std::string clone_path = dir + "/bench_clone";
  std::filesystem::remove_all(path);
  std::filesystem::remove_all(clone_path);

  t0 = WallClock::now();
  c0 = CpuNow();
  {
    CreateOptions options;
    options.shard_bytes_max = uint64_t{512} << 20;
    auto w = WritableCheckpoint::Create(path, big, {{"format", "pt"}}, options);
    if (!w.ok()) return Die(w.status());
    uint64_t off = 0;
    for (auto& t : (*w)->view().tensors) {
      std::memcpy(t.data, a.data() + off, t.desc->bytes());
      off += t.desc->bytes();
    }
    Status s = (*w)->Commit();
    if (!s.ok()) return Die(s);
  }
  const double create_s = Since(t0), create_cpu = CpuNow() - c0;

  auto base = Checkpoint::Open(path);
  if (!base.ok()) return Die(base.status());
  t0 = WallClock::now();
  c0 = CpuNow();
  uint64_t sum = 0;
  for (const auto& t : (*base)->view().tensors)
    for (uint64_t i = 0; i < t.desc->bytes(); i += 64) sum += t.data[i];
  const double read_s = Since(t0), read_cpu = CpuNow() - c0;

  t0 = WallClock::now();
  c0 = CpuNow();
  {
    auto c = WritableCheckpoint::CloneForWrite(**base, clone_path);
    if (!c.ok()) return Die(c.status());
    Status s = (*c)->Commit();
    if (!s.ok()) return Die(s);
  }
  const double clone_s = Since(t0), clone_cpu = CpuNow() - c0;

  // Many small tensors: header parsing and validation dominate.
  std::vector<TensorDesc> small;
  for (uint64_t i = 0; i < small_count; ++i)
    small.push_back({"model.layers." + std::to_string(i / 16) + ".mlp.proj_" + std::to_string(i % 16) +
                         ".weight",
                     DType::kBF16, {8, 8}});
  const std::string small_path = dir + "/bench_small.safetensors";
  std::filesystem::remove(small_path);
  {
    auto w = WritableCheckpoint::Create(small_path, small, {});
    if (!w.ok()) return Die(w.status());
    Status s = (*w)->Commit();
    if (!s.ok()) return Die(s);
  }
  t0 = WallClock::now();
  c0 = CpuNow();
  auto opened = Checkpoint::Open(small_path);
  const double open_s = Since(t0), open_cpu = CpuNow() - c0;
  if (!opened.ok()) return Die(opened.status());
  const uint64_t header = (*opened)->header_bytes(0).size();

  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("bytes %.2f GB, %zu shards; memcpy %.3f s wall, %.3f s cpu (%.2f GB/s)\n", gb,
              (*base)->files().size(), memcpy_s, memcpy_cpu, gb / memcpy_s);
  std::printf("%-22s %9s %9s %9s %12s %12s\n", "step", "wall s", "cpu s", "GB/s", "wall/memcpy",
              "cpu/memcpy");
  auto row = [&](const char* name, double s, double cpu) {
    std::printf("%-22s %9.3f %9.3f %9.2f %12.2f %12.2f\n", name, s, cpu, gb / s, s / memcpy_s,
                cpu / memcpy_cpu);
  };
  row("create+fill+commit", create_s, create_cpu);
  row("read (mapped, hot)", read_s, read_cpu);
  row("clone+commit", clone_s, clone_cpu);
  std::printf("open %llu tensors (%.1f MB header): %.3f s wall, %.3f s cpu, %.2f us cpu/tensor\n",
              static_cast<unsigned long long>(small_count), header / 1e6, open_s, open_cpu,
              open_cpu * 1e6 / static_cast<double>(small_count));
  std::filesystem::remove_all(path);
  std::filesystem::remove_all(clone_path);
  std::filesystem::remove(small_path);
  return sum == 0xFFFFFFFFFFFFFFFF;  // keeps the read loop
}
