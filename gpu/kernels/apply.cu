// GpuApply and GpuComputeDigest (include/tern/gpu.h): the apply of format 1
// and 2 patches on device memory. Docs: docs/gpu.md, "Apply".
//
// Pipeline per batch of records (bounded by GpuOptions::scratch_bytes):
//   upload the records' bytes -> DecodeKernel (a thread per record, the
//   TERN_HD decoders of codec_ops.h and context_ops.h, changes to scratch;
//   a CONTEXT record reads its segment's base in the view) -> VerifyKernel (a
//   thread per change: old value, new value, digest terms).
// Then one synchronisation: decode errors and the target digest are checked
// on the host, and only then WriteKernel (a thread per change) writes. A
// patch that fits one batch is decoded once; otherwise the write pass
// decodes each batch again (the scratch is not kept across batches).
#include <algorithm>
#include <limits>
#include <vector>

#include "gpu/host/patch_walk.h"
#include "gpu/host/plan.h"
#include "gpu/kernels/apply_internal.h"
#include "gpu/kernels/cuda_util.h"
#include "gpu/kernels/device_access.cuh"
#include "gpu/ops/codec_ops.h"
#include "gpu/ops/context_ops.h"
#include "tern/gpu.h"

namespace tern {
namespace gpu {
namespace {

constexpr unsigned long long kNoError = std::numeric_limits<unsigned long long>::max();

struct DevRecord {
  uint8_t* data;       // the tensor's bytes
  uint64_t seed;       // its digest seed
  uint64_t first;      // first element of the segment
  uint64_t payload;    // offset of the record in the batch's uploaded bytes
  uint64_t change_at;  // first slot of its changes in the batch's scratch
  int32_t w;
  int32_t ctx_shift;  // the dtype's exponent field (CONTEXT records)
  uint32_t ctx_mask;  // 0: none
  // Tensor-parallel shard (sharded != 0): `data` holds this block of the
  // tensor, changes outside it are skipped, and counts says whether this
  // rank adds the element terms (a replicated tensor: rank 0 only).
  ShardBlock block;
  uint64_t base_first;  // index in `data` of the segment's first element (CONTEXT base reads)
  uint32_t sharded;
  uint32_t counts;
};

// Where global element idx of record d lives in its data (false: not here).
__device__ __forceinline__ bool DataIndex(const DevRecord& d, uint64_t idx, uint64_t* at) {
  if (!d.sharded) {
    *at = idx;
    return true;
  }
  return ShardLocalIndex(d.block, idx, at);
}

// Scratch of one batch: changes as (record in batch, position, delta).
struct Changes {
  uint32_t* rec;
  uint32_t* pos;
  uint64_t* delta;
};

__global__ void DecodeKernel(const DevRecord* recs, uint32_t nrec, uint64_t rec_base, const uint8_t* payload,
                             Changes ch, int* errors, unsigned long long* first_bad) {
  for (uint32_t r = blockIdx.x * blockDim.x + threadIdx.x; r < nrec; r += gridDim.x * blockDim.x) {
    const DevRecord d = recs[r];
    const uint8_t* at = payload + d.payload;
    SegmentStreams s;
    uint8_t* hb = reinterpret_cast<uint8_t*>(&s.h);
    for (int i = 0; i < static_cast<int>(sizeof(RecordHeader)); ++i) hb[i] = at[i];  // unaligned
    s.table = at + sizeof(RecordHeader);
    s.positions = s.table + s.h.table_bytes;
    s.values = s.positions + s.h.position_bytes;
    // The CONTEXT decoder reads the base at first_element + i; on a shard
    // the segment lies inside it (RecordsForShards) at base_first.
    s.h.first_element = d.base_first;
    // Never more than changed_count slots: a stream that holds more changes
    // fails (count mismatch) but must not write into the next record's.
    const uint64_t limit = s.h.changed_count;
    uint64_t j = 0;
    // A CONTEXT record's classes come from the base values in the view: the
    // verify pass runs before any write, and in the write pass of a
    // many-batch patch earlier batches have written only their own
    // segments, which never share a byte with this one's (spec §3.3).
    const ContextField f{d.ctx_mask != 0, d.ctx_shift, d.ctx_mask};
    const int e = DecodeRecordOnBase(s, d.w, d.data, f, [&](uint64_t p, uint64_t delta) {
      uint64_t at;
      if (!DataIndex(d, d.first + p, &at)) return;  // another rank's
      if (j < limit) {
        ch.rec[d.change_at + j] = r;
        ch.pos[d.change_at + j] = static_cast<uint32_t>(p);
        ch.delta[d.change_at + j] = delta;
      }
      ++j;
    });
    errors[rec_base + r] = e;
    if (e != kDecodeOk) atomicMin(first_bad, static_cast<unsigned long long>(rec_base + r));
  }
}

// Digest terms of every change (old read from the view, new = old + delta).
__global__ void VerifyKernel(const DevRecord* recs, Changes ch, uint64_t n, const unsigned long long* first_bad,
                             unsigned long long* acc) {
  if (*first_bad != kNoError) return;  // scratch may hold unwritten slots
  uint64_t a[4] = {0, 0, 0, 0};
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const DevRecord& d = recs[ch.rec[i]];
    const uint64_t idx = d.first + ch.pos[i];
    uint64_t at = idx;
    DataIndex(d, idx, &at);  // in the shard: decode kept only such changes
    const uint64_t old = LoadW(d.data, at, d.w);
    if (d.counts) AddElementChange(d.seed, idx, old, (old + ch.delta[i]) & WidthMask(d.w), a);
  }
  WarpAddLanes(a, acc);
}

__global__ void WriteKernel(const DevRecord* recs, Changes ch, uint64_t n) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const DevRecord& d = recs[ch.rec[i]];
    uint64_t idx = d.first + ch.pos[i];
    DataIndex(d, idx, &idx);
    if (d.w != 4) {
      StoreW(d.data, idx, d.w, (LoadW(d.data, idx, d.w) + ch.delta[i]) & WidthMask(d.w));
      continue;
    }
    // Two nibbles share a byte (codec_ops.h, F4ByteToWrite). Changes are in
    // position order within a record, records never share a byte; a shard
    // keeps a byte's two nibbles together (even columns, ShardOf), so
    // segment neighbours are neighbours in the shard.
    const bool prev_partner = i > 0 && ch.rec[i - 1] == ch.rec[i] && ch.pos[i - 1] + 1 == ch.pos[i];
    const bool next_partner = i + 1 < n && ch.rec[i + 1] == ch.rec[i] && ch.pos[i + 1] == ch.pos[i] + 1;
    uint8_t byte;
    if (F4ByteToWrite(d.data[idx >> 1], idx & 1, ch.delta[i], prev_partner, next_partner,
                      next_partner ? ch.delta[i + 1] : 0, &byte))
      d.data[idx >> 1] = byte;
  }
}

// 1 in *bad when this rank failed to decode (for the island's sum).
__global__ void BadFlagKernel(const unsigned long long* first_bad, unsigned long long* bad) {
  *bad = *first_bad != kNoError ? 1 : 0;
}

__global__ void DigestKernel(const uint8_t* data, uint64_t n, int w, uint64_t seed, unsigned long long* acc) {
  uint64_t a[4] = {0, 0, 0, 0};
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    AddElementHash(seed, i, LoadW(data, i, w), a);
  WarpAddLanes(a, acc);
}

const char* DecodeErrorText(int e) {
  switch (e) {
    case kBadTable: return "bad code table";
    case kBadValue: return "bad value code";
    case kBadPosition: return "bad position code (CONTEXT: or a rank past its class, a wrong base?)";
    case kZeroDelta: return "zero delta in a SPARSE segment";
    case kCountMismatch: return "changed count mismatch";
    case kNotClean: return "stream not cleanly consumed";
    case kBadHeader: return "inconsistent record header";
    default: return "unknown decode error";
  }
}

}  // namespace
}  // namespace gpu

namespace gpu {

Status ApplyOnDevice(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
                     const GpuOptions& options, ViewDigest* new_digest, const ShardedApply* sharded) {
  TERN_RETURN_IF_ERROR(RequireDevice());
  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  // Host checks; on an island their verdict is shared before anything else
  // (below), so a rank that refuses does not leave the others waiting.
  WalkedPatch wp;
  std::vector<uint64_t> selected;  // the records this rank decodes, in patch order
  auto host_checks = [&]() -> Status {
    TERN_ASSIGN_OR_RETURN(wp, WalkPatch(patch));
    TERN_REQUIRE(view.tensors.size() == wp.tensors.size(), kMismatch, "the view has ", view.tensors.size(),
                 " tensors, the patch ", wp.tensors.size());
    for (size_t t = 0; t < wp.tensors.size(); ++t)
      TERN_REQUIRE(view.tensors[t].desc->SameLayout(wp.tensors[t].desc), kMismatch, "tensor '",
                   wp.tensors[t].desc.name, "' differs from the patch's layout");
    TERN_RETURN_IF_ERROR(CheckDeviceView(view));
    TERN_REQUIRE(current_digest == wp.base_digest, kMismatch, "the view is not the patch's base (digest ",
                 current_digest.ToString(), ", patch base ", wp.base_digest.ToString(), ")");
    if (sharded == nullptr) {
      selected.resize(wp.records.size());
      for (uint64_t r = 0; r < selected.size(); ++r) selected[r] = r;
      return Status::Ok();
    }
    TERN_RETURN_IF_ERROR(sharded->preflight);
    TERN_REQUIRE(sharded->shards.size() == wp.tensors.size(), kInvalidArgument, "shards for ",
                 sharded->shards.size(), " tensors, the patch has ", wp.tensors.size());
    TERN_ASSIGN_OR_RETURN(selected, RecordsForShards(wp.records, sharded->shards));
    return Status::Ok();
  };
  const Status checked = host_checks();

  // first_bad, acc[4], bad (the island's count of ranks that failed).
  DeviceBuffer d_flags;
  constexpr int kFlags = 6;
  if (sharded != nullptr) {
    TERN_RETURN_IF_ERROR(d_flags.Allocate(kFlags * sizeof(unsigned long long), stream));
    const unsigned long long pre[kFlags] = {kNoError, 0, 0, 0, 0, checked.ok() ? 0ull : 1ull};
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_flags.as<void>(), pre, sizeof(pre), cudaMemcpyHostToDevice, stream));
    TERN_RETURN_IF_ERROR(sharded->all_reduce(reinterpret_cast<uint64_t*>(d_flags.as<unsigned long long>() + 5), 1,
                                             stream));
    unsigned long long refused = 0;
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&refused, d_flags.as<unsigned long long>() + 5, sizeof(refused),
                                              cudaMemcpyDeviceToHost, stream));
    TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    TERN_RETURN_IF_ERROR(checked);
    TERN_REQUIRE(refused == 0, kCancelled, "island: ", refused, " other rank(s) refused the patch before decoding");
  } else {
    TERN_RETURN_IF_ERROR(checked);
    TERN_RETURN_IF_ERROR(d_flags.Allocate(kFlags * sizeof(unsigned long long), stream));
    if (wp.records.empty()) {
      TERN_REQUIRE(wp.target_digest == wp.base_digest, kCorrupt, "a patch without records changes the digest");
      if (new_digest) *new_digest = wp.target_digest;
      return Status::Ok();
    }
  }

  // Host descriptors and batches (gpu/host/plan.h) of the selected records. A
  // batch holds whole records; the largest record alone sets the floor of
  // the scratch.
  std::vector<uint64_t> seeds(wp.tensors.size());
  for (size_t t = 0; t < wp.tensors.size(); ++t) seeds[t] = TensorSeed(wp.tensors[t].desc);
  std::vector<WalkedRecord> records(selected.size());
  for (size_t i = 0; i < selected.size(); ++i) records[i] = wp.records[selected[i]];
  const ApplyPlan plan = PlanApply(records, options.scratch_bytes);
  const std::vector<ApplyBatch>& batches = plan.batches;
  const uint64_t max_changes = plan.max_changes, max_bytes = plan.max_bytes;
  std::vector<DevRecord> recs(records.size());
  // The patch bytes of batch b: its records, which may not be consecutive
  // in the patch on a shard; they are gathered on the host.
  std::vector<std::vector<uint8_t>> gathered(sharded != nullptr ? batches.size() : 0);
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    const ApplyBatch& b = batches[bi];
    for (uint64_t r = b.rec_begin; r < b.rec_end; ++r) {
      const WalkedRecord& wr = records[r];
      DevRecord& d = recs[r];
      const uint32_t t = wr.h.tensor_index;
      d.data = view.tensors[t].data;
      d.seed = seeds[t];
      d.first = wr.h.first_element;
      const DType dt = wp.tensors[t].desc.dtype;
      d.w = ElementBits(dt);
      const ContextField f = ContextFieldOfCode(static_cast<int>(dt));
      d.ctx_shift = f.shift;
      d.ctx_mask = f.mask;
      d.change_at = plan.change_at[r];
      d.base_first = d.first;
      d.sharded = 0;
      d.counts = 1;
      if (sharded != nullptr) {
        const TpShard& sh = sharded->shards[t];
        d.sharded = 1;
        d.block = sh.block;
        d.counts = sh.counts_elements ? 1 : 0;
        if (ShardLocalIndex(sh.block, d.first, &d.base_first) == false) d.base_first = 0;  // not CONTEXT then
        d.payload = gathered[bi].size();
        gathered[bi].insert(gathered[bi].end(), patch.begin() + wr.offset, patch.begin() + wr.offset + wr.total_bytes);
      } else {
        d.payload = wr.offset - b.bytes_begin;
      }
    }
  }

  DeviceBuffer d_recs, d_errors, d_payload, d_rec, d_pos, d_delta;
  TERN_RETURN_IF_ERROR(d_recs.Allocate(std::max<size_t>(recs.size(), 1) * sizeof(DevRecord), stream));
  TERN_RETURN_IF_ERROR(d_errors.Allocate(std::max<size_t>(recs.size(), 1) * sizeof(int), stream));
  TERN_RETURN_IF_ERROR(d_payload.Allocate(std::max<uint64_t>(max_bytes, 1), stream));
  TERN_RETURN_IF_ERROR(d_rec.Allocate(std::max<uint64_t>(max_changes, 1) * sizeof(uint32_t), stream));
  TERN_RETURN_IF_ERROR(d_pos.Allocate(std::max<uint64_t>(max_changes, 1) * sizeof(uint32_t), stream));
  TERN_RETURN_IF_ERROR(d_delta.Allocate(std::max<uint64_t>(max_changes, 1) * sizeof(uint64_t), stream));
  if (!recs.empty())
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_recs.as<void>(), recs.data(), recs.size() * sizeof(DevRecord),
                                              cudaMemcpyHostToDevice, stream));
  const unsigned long long init[kFlags] = {kNoError, 0, 0, 0, 0, 0};
  TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_flags.as<void>(), init, sizeof(init), cudaMemcpyHostToDevice, stream));
  unsigned long long* first_bad = d_flags.as<unsigned long long>();
  unsigned long long* acc = first_bad + 1;
  const Changes ch{d_rec.as<uint32_t>(), d_pos.as<uint32_t>(), d_delta.as<uint64_t>()};

  auto decode = [&](size_t bi) -> Status {
    const ApplyBatch& b = batches[bi];
    const uint8_t* src = sharded != nullptr ? gathered[bi].data() : patch.data() + b.bytes_begin;
    const uint64_t bytes = sharded != nullptr ? gathered[bi].size() : b.bytes_end - b.bytes_begin;
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_payload.as<void>(), src, bytes, cudaMemcpyHostToDevice, stream));
    const uint32_t n = static_cast<uint32_t>(b.rec_end - b.rec_begin);
    DecodeKernel<<<GridFor(n, 64), 64, 0, stream>>>(d_recs.as<DevRecord>() + b.rec_begin, n, b.rec_begin,
                                                    d_payload.as<uint8_t>(), ch, d_errors.as<int>(), first_bad);
    TERN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  };
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    TERN_RETURN_IF_ERROR(decode(bi));
    const ApplyBatch& b = batches[bi];
    VerifyKernel<<<GridFor(b.changes, 256), 256, 0, stream>>>(d_recs.as<DevRecord>() + b.rec_begin, ch, b.changes,
                                                              first_bad, acc);
    TERN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (sharded != nullptr) {
    // The island's verdict: Σ of every rank's digest change and of the
    // ranks that failed to decode; every rank then decides alike.
    BadFlagKernel<<<1, 1, 0, stream>>>(first_bad, acc + 4);
    TERN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    TERN_RETURN_IF_ERROR(sharded->all_reduce(reinterpret_cast<uint64_t*>(acc), 5, stream));
  }
  unsigned long long flags[kFlags];
  TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(flags, d_flags.as<void>(), sizeof(flags), cudaMemcpyDeviceToHost, stream));
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (flags[0] != kNoError) {
    int e = 0;
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpy(&e, d_errors.as<int>() + flags[0], sizeof(int), cudaMemcpyDeviceToHost));
    const WalkedRecord& wr = records[flags[0]];
    return TERN_ERROR(kCorrupt, "tensor '", wp.tensors[wr.h.tensor_index].desc.name, "': segment at element ",
                      wr.h.first_element, ": ", DecodeErrorText(e));
  }
  TERN_REQUIRE(flags[5] == 0, kCorrupt, "island: ", flags[5], " other rank(s) failed to decode their share");
  ViewDigest target = wp.base_digest;
  for (int l = 0; l < 4; ++l) target.lanes[l] += flags[1 + l];
  TERN_REQUIRE(target == wp.target_digest, kCorrupt, "target digest mismatch: the changes give ",
               target.ToString(), ", the patch names ", wp.target_digest.ToString());

  for (size_t bi = 0; bi < batches.size(); ++bi) {
    if (batches.size() > 1) TERN_RETURN_IF_ERROR(decode(bi));
    const ApplyBatch& b = batches[bi];
    WriteKernel<<<GridFor(b.changes, 256), 256, 0, stream>>>(d_recs.as<DevRecord>() + b.rec_begin, ch, b.changes);
    TERN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (new_digest) *new_digest = wp.target_digest;
  return Status::Ok();
}

}  // namespace gpu

Status GpuApply(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
                const GpuOptions& options, ViewDigest* new_digest) {
  return gpu::ApplyOnDevice(view, patch, current_digest, options, new_digest, nullptr);
}

Result<ViewDigest> GpuComputeDigest(const ServeView& view, const GpuOptions& options) {
  using namespace gpu;
  TERN_RETURN_IF_ERROR(RequireDevice());
  TERN_RETURN_IF_ERROR(CheckDeviceView(view));
  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  DeviceBuffer d_acc;
  TERN_RETURN_IF_ERROR(d_acc.Allocate(4 * sizeof(unsigned long long), stream));
  TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_acc.as<void>(), 0, d_acc.bytes(), stream));
  ViewDigest d;
  for (const TensorRef& t : view.tensors) {
    const uint64_t seed = TensorSeed(*t.desc);
    d += TensorTerm(seed);
    const uint64_t n = t.desc->elements();
    if (n == 0) continue;
    DigestKernel<<<GridFor(n, 256), 256, 0, stream>>>(t.data, n, ElementBits(t.desc->dtype), seed,
                                                      d_acc.as<unsigned long long>());
    TERN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  unsigned long long acc[4];
  TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(acc, d_acc.as<void>(), sizeof(acc), cudaMemcpyDeviceToHost, stream));
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  for (int l = 0; l < 4; ++l) d.lanes[l] += acc[l];
  return d;
}

}  // namespace tern
