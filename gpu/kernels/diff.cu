// GpuDiff (include/tern/gpu.h): publishing from device tensors. The same
// patch bytes as tern::Diff. Docs: docs/gpu.md, "Diff and encode".
//
// Per batch of segments (bounded by GpuOptions::scratch_bytes):
//   CompactKernel (a block per segment): compare old and new, write the
//     changed positions and deltas in order (block-wide ballot scan) and the
//     segment's digest delta;
//   EncodeKernel (a thread per segment): the TERN_HD encoder of
//     encode_ops.h writes the record without its checksum into a slot sized
//     for the worst case;
//   the host reads the records' sizes (one synchronisation), PackKernel
//   gathers the records into one buffer that comes back in one copy (a
//   second synchronisation), and the host appends the XXH3 checksums and
//   hands them to PatchBuilder, which checks each record's framing again.
// TODO(perf): a warp per segment for the encoder (histogram and bit offsets
// by prefix sums); double-buffer batches so copies overlap the next batch.
#include <algorithm>
#include <vector>

#include "base/hash.h"
#include "gpu/host/plan.h"
#include "gpu/kernels/cuda_util.h"
#include "gpu/kernels/device_access.cuh"
#include "gpu/ops/encode_ops.h"
#include "tern/gpu.h"

namespace tern {
namespace gpu {
namespace {

struct DevSegment {
  const uint8_t* old_data;
  const uint8_t* new_data;
  uint64_t seed;
  uint64_t first;
  uint64_t count;
  uint64_t scratch_at;  // first slot of its changes
  uint64_t out_at;      // its output slot (bytes)
  uint64_t out_capacity;
  uint32_t tensor;
  int32_t w;
};

constexpr unsigned kCompactThreads = 256;

__global__ void CompactKernel(const DevSegment* segs, uint32_t nseg, uint32_t* pos, uint64_t* delta,
                              uint64_t* counts, unsigned long long* digests) {
  __shared__ uint32_t warp_count[kCompactThreads / 32];
  __shared__ uint32_t warp_offset[kCompactThreads / 32];
  __shared__ unsigned long long lanes[4];
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (uint32_t sidx = blockIdx.x; sidx < nseg; sidx += gridDim.x) {
    const DevSegment s = segs[sidx];
    const uint64_t mask = WidthMask(s.w);
    uint64_t a[4] = {0, 0, 0, 0};
    uint64_t running = 0;
    if (threadIdx.x < 4) lanes[threadIdx.x] = 0;
    for (uint64_t base = 0; base < s.count; base += kCompactThreads) {
      const uint64_t i = base + threadIdx.x;
      bool changed = false;
      uint64_t d = 0;
      if (i < s.count) {
        const uint64_t idx = s.first + i;
        const uint64_t x = LoadW(s.old_data, idx, s.w), y = LoadW(s.new_data, idx, s.w);
        if (x != y) {
          changed = true;
          d = (y - x) & mask;
          AddElementChange(s.seed, idx, x, y, a);
        }
      }
      const uint32_t ballot = __ballot_sync(0xffffffffu, changed);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      __syncthreads();
      if (threadIdx.x == 0) {
        uint32_t sum = 0;
        for (unsigned k = 0; k < kCompactThreads / 32; ++k) {
          warp_offset[k] = sum;
          sum += warp_count[k];
        }
        warp_count[0] = sum;  // the chunk's total, read below
      }
      __syncthreads();
      if (changed) {
        const uint64_t at = s.scratch_at + running + warp_offset[warp] + __popc(ballot & ((1u << lane) - 1));
        pos[at] = static_cast<uint32_t>(i);
        delta[at] = d;
      }
      running += warp_count[0];
      __syncthreads();
    }
    for (int l = 0; l < 4; ++l) {
      uint64_t v = a[l];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
      if (lane == 0 && v != 0) atomicAdd(&lanes[l], static_cast<unsigned long long>(v));
    }
    __syncthreads();
    if (threadIdx.x < 4) digests[4 * uint64_t{sidx} + threadIdx.x] = lanes[threadIdx.x];
    if (threadIdx.x == 0) counts[sidx] = running;
    __syncthreads();
  }
}

__global__ void EncodeKernel(const DevSegment* segs, uint32_t nseg, const uint32_t* pos, const uint64_t* delta,
                             const uint64_t* counts, uint8_t* out, uint64_t* out_bytes) {
  for (uint32_t sidx = blockIdx.x * blockDim.x + threadIdx.x; sidx < nseg; sidx += gridDim.x * blockDim.x) {
    const DevSegment s = segs[sidx];
    const uint64_t n = counts[sidx];
    if (n == 0) {
      out_bytes[sidx] = 0;
      continue;
    }
    const uint64_t bytes = EncodeRecordBody(pos + s.scratch_at, delta + s.scratch_at, n, s.w, s.tensor, s.first,
                                            s.count, out + s.out_at, s.out_capacity);
    out_bytes[sidx] = bytes == 0 ? ~uint64_t{0} : bytes;
  }
}

// Gathers the batch's records from their worst-case slots into one packed
// buffer, so the host copies them back in one transfer instead of one per
// segment (each copy to pageable memory is a round trip).
__global__ void PackKernel(const DevSegment* segs, uint32_t nseg, const uint8_t* out, const uint64_t* out_bytes,
                           const uint64_t* packed_at, uint8_t* packed) {
  for (uint32_t sidx = blockIdx.x; sidx < nseg; sidx += gridDim.x) {
    const uint64_t n = out_bytes[sidx];
    const uint8_t* src = out + segs[sidx].out_at;
    uint8_t* dst = packed + packed_at[sidx];
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  }
}

Status CheckSameLayout(const ServeView& a, const ServeView& b) {
  TERN_REQUIRE(a.tensors.size() == b.tensors.size(), kMismatch, "the views have ", a.tensors.size(), " and ",
               b.tensors.size(), " tensors");
  for (size_t t = 0; t < a.tensors.size(); ++t)
    TERN_REQUIRE(a.tensors[t].desc->SameLayout(*b.tensors[t].desc), kMismatch, "tensor '",
                 a.tensors[t].desc->name, "' differs between the views");
  return Status::Ok();
}

}  // namespace
}  // namespace gpu

Result<std::vector<uint8_t>> GpuDiff(const ServeView& old_view, const ServeView& new_view, const DiffOptions& diff,
                                     const GpuOptions& options, const ViewDigest* base_digest) {
  using namespace gpu;
  TERN_REQUIRE(diff.segment_elements >= 1 && diff.segment_elements < kMaxSegmentElements, kInvalidArgument,
               "segment_elements must be in [1, 2^24)");
  TERN_RETURN_IF_ERROR(CheckSameLayout(old_view, new_view));
  TERN_RETURN_IF_ERROR(RequireDevice());
  TERN_RETURN_IF_ERROR(CheckDeviceView(old_view));
  TERN_RETURN_IF_ERROR(CheckDeviceView(new_view));
  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  ViewDigest base;
  if (base_digest != nullptr) {
    base = *base_digest;
  } else {
    TERN_ASSIGN_OR_RETURN(base, GpuComputeDigest(old_view, options));
  }
  // Format 1 always: no CONTEXT encoder on the device (docs/gpu.md).
  PatchBuilder builder(old_view, diff.base_version, diff.target_version, base, /*format_version=*/1);

  // Segments as Diff cuts them, in batches (gpu/host/plan.h).
  const DiffPlan plan = PlanDiff(old_view, diff.segment_elements, options.scratch_bytes);
  const auto& batches = plan.batches;
  const uint64_t max_elements = plan.max_elements, max_out = plan.max_out, max_segs = plan.max_segments;
  std::vector<uint64_t> seeds(old_view.tensors.size());
  for (size_t t = 0; t < seeds.size(); ++t) seeds[t] = TensorSeed(*old_view.tensors[t].desc);
  std::vector<DevSegment> segs(plan.segments.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    const DiffSegment& p = plan.segments[i];
    DevSegment& s = segs[i];
    s.old_data = old_view.tensors[p.tensor].data;
    s.new_data = new_view.tensors[p.tensor].data;
    s.seed = seeds[p.tensor];
    s.first = p.first;
    s.count = p.count;
    s.scratch_at = p.scratch_at;
    s.out_at = p.out_at;
    s.out_capacity = p.out_capacity;
    s.tensor = p.tensor;
    s.w = p.w;
  }
  DeviceBuffer d_segs, d_pos, d_delta, d_counts, d_digests, d_out, d_out_bytes;
  TERN_RETURN_IF_ERROR(d_segs.Allocate(std::max<size_t>(segs.size(), 1) * sizeof(DevSegment), stream));
  TERN_RETURN_IF_ERROR(d_pos.Allocate(std::max<uint64_t>(max_elements, 1) * sizeof(uint32_t), stream));
  TERN_RETURN_IF_ERROR(d_delta.Allocate(std::max<uint64_t>(max_elements, 1) * sizeof(uint64_t), stream));
  TERN_RETURN_IF_ERROR(d_counts.Allocate(std::max<uint64_t>(max_segs, 1) * sizeof(uint64_t), stream));
  TERN_RETURN_IF_ERROR(d_digests.Allocate(std::max<uint64_t>(max_segs, 1) * 4 * sizeof(uint64_t), stream));
  TERN_RETURN_IF_ERROR(d_out.Allocate(std::max<uint64_t>(max_out, 1), stream));
  TERN_RETURN_IF_ERROR(d_out_bytes.Allocate(std::max<uint64_t>(max_segs, 1) * sizeof(uint64_t), stream));
  if (!segs.empty())
    TERN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(d_segs.as<void>(), segs.data(), segs.size() * sizeof(DevSegment), cudaMemcpyHostToDevice, stream));

  std::vector<uint64_t> out_bytes, digests;
  for (const auto& [begin, end] : batches) {
    const uint32_t n = static_cast<uint32_t>(end - begin);
    const DevSegment* bs = d_segs.as<DevSegment>() + begin;
    CompactKernel<<<std::min<uint32_t>(n, 65535u), kCompactThreads, 0, stream>>>(
        bs, n, d_pos.as<uint32_t>(), d_delta.as<uint64_t>(), d_counts.as<uint64_t>(),
        d_digests.as<unsigned long long>());
    TERN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    EncodeKernel<<<GridFor(n, 32), 32, 0, stream>>>(bs, n, d_pos.as<uint32_t>(), d_delta.as<uint64_t>(),
                                                    d_counts.as<uint64_t>(), d_out.as<uint8_t>(),
                                                    d_out_bytes.as<uint64_t>());
    TERN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    out_bytes.resize(n);
    digests.resize(4 * uint64_t{n});
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out_bytes.data(), d_out_bytes.as<void>(), n * sizeof(uint64_t),
                                              cudaMemcpyDeviceToHost, stream));
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(digests.data(), d_digests.as<void>(), 4 * n * sizeof(uint64_t),
                                              cudaMemcpyDeviceToHost, stream));
    TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    // Sizes known: pack the records and copy them back in one transfer.
    std::vector<uint64_t> packed_at(n);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const DevSegment& sg = segs[begin + i];
      TERN_REQUIRE(out_bytes[i] != ~uint64_t{0}, kInternal, "GPU encoder overflowed its slot (segment of tensor '",
                   old_view.tensors[sg.tensor].desc->name, "' at ", sg.first, ")");
      packed_at[i] = total;
      total += out_bytes[i];
    }
    std::vector<uint8_t> packed(total);
    if (total > 0) {
      DeviceBuffer d_packed, d_packed_at;
      TERN_RETURN_IF_ERROR(d_packed.Allocate(total, stream));
      TERN_RETURN_IF_ERROR(d_packed_at.Allocate(n * sizeof(uint64_t), stream));
      TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_packed_at.as<void>(), packed_at.data(), n * sizeof(uint64_t),
                                                cudaMemcpyHostToDevice, stream));
      PackKernel<<<std::min<uint32_t>(n, 65535u), 256, 0, stream>>>(bs, n, d_out.as<uint8_t>(),
                                                                    d_out_bytes.as<uint64_t>(),
                                                                    d_packed_at.as<uint64_t>(), d_packed.as<uint8_t>());
      TERN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      TERN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(packed.data(), d_packed.as<void>(), total, cudaMemcpyDeviceToHost, stream));
      TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    }
    std::vector<SegmentRecord> records(n);
    for (uint32_t i = 0; i < n; ++i) {
      const DevSegment& sg = segs[begin + i];
      SegmentRecord& r = records[i];
      r.tensor_index = sg.tensor;
      r.first_element = sg.first;
      r.element_count = sg.count;
      for (int l = 0; l < 4; ++l) r.digest_delta.lanes[l] = digests[4 * uint64_t{i} + l];
      if (out_bytes[i] == 0) continue;
      r.bytes.assign(packed.begin() + packed_at[i], packed.begin() + packed_at[i] + out_bytes[i]);
      r.bytes.resize(out_bytes[i] + kRecordChecksumBytes);
    }
    for (SegmentRecord& r : records) {
      if (!r.bytes.empty()) {
        const uint64_t body = r.bytes.size() - kRecordChecksumBytes;
        const uint64_t sum = Xxh3(r.bytes.data(), body);
        std::memcpy(r.bytes.data() + body, &sum, kRecordChecksumBytes);
      }
      TERN_RETURN_IF_ERROR(builder.Add(std::move(r)));
    }
  }
  return builder.Finish();
}

}  // namespace tern
