// The GPU path: serve views whose tensor bytes live in GPU memory, patched,
// digested, diffed and quantized there, bit-identical to the CPU codec and
// quantizers (which are the reference). Design and status: docs/gpu.md.
//
// Views: the ServeView / MutableServeView types of tern/view.h with `data`
// pointing to device memory of the current CUDA device (each tensor's bytes
// aligned to its element size, as cudaMalloc gives). Streams: a `void*` that
// is a cudaStream_t (nullptr: the legacy default stream), so this header
// needs no CUDA include.
//
// Ordering: work is queued on the options' stream with no host
// synchronisation inside a call's hot loop; each call synchronises once at
// its end to return a Status (or once per batch where it must copy bytes to
// the host, GpuDiff). Memory: scratch is bounded by GpuOptions::scratch_bytes
// and comes from the device's current memory pool (cudaMallocAsync, freed in
// stream order); an application that calls often should raise that pool's
// cudaMemPoolAttrReleaseThreshold so scratch is reused, not remapped, per
// call (a process-wide choice this library leaves to the application).
// Tensors of more than 2^31 elements are indexed with 64 bits throughout.
// A view's `data` may also be pinned, mapped host memory (cudaHostAlloc
// with cudaHostAllocMapped): a publisher can keep its previous view there
// and GpuDiff reads it over PCIe.
//
// Availability: CUDA is loaded at run time (the CUDA runtime is linked
// statically and opens the driver when first used), so programs built with
// the GPU path run on machines without a GPU: ProbeGpu() says why there is
// none and every call returns kUnavailable with that reason. A build without
// nvcc answers the same way ("built without CUDA").
//
// Thread safety: calls are reentrant; two calls on one stream are ordered by
// the stream. A view must not be written by anything else during a call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tern/digest.h"
#include "tern/export.h"
#include "tern/patch.h"
#include "tern/quantize.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern {

struct GpuProbe {
  bool built_with_cuda = false;
  int devices = 0;
  std::string device_name;  // device 0's name when devices > 0
  std::string reason;       // why devices == 0 (no driver, no device, ...)
};
TERN_EXPORT GpuProbe ProbeGpu();

struct GpuOptions {
  void* stream = nullptr;  // cudaStream_t
  // Upper bound on device scratch one call allocates (apply: decoded
  // changes, 16 bytes each, plus the patch bytes of one batch; diff: 12
  // bytes per element of one batch of segments plus their output slots).
  uint64_t scratch_bytes = uint64_t{256} << 20;
};

// Apply (tern::Apply's contract, on device memory), of format 1 and format 2
// patches (CONTEXT segments decode against the view): verifies the layout
// against the manifest and current_digest against the base digest
// (kMismatch), decodes every segment on the GPU and verifies the target
// digest from the changes alone (kCorrupt) before it writes anything; on any
// error the view is untouched. `patch` is in host memory (it is small next
// to the view; its checksums are verified on the host).
TERN_EXPORT Status GpuApply(MutableServeView& device_view, std::span<const uint8_t> patch,
                            const ViewDigest& current_digest, const GpuOptions& options,
                            ViewDigest* new_digest = nullptr);

// The view digest (tern::ComputeDigest) of a device view.
TERN_EXPORT Result<ViewDigest> GpuComputeDigest(const ServeView& device_view, const GpuOptions& options);

// Publishing from device tensors: tern::Diff with the compare, compaction and
// segment encoding on the GPU; the same patch bytes as Diff with
// format_version 1. It writes format 1 whatever diff.format_version says (the
// device has no CONTEXT encoder yet; every reader reads format 1), so the
// patch is Diff's only when that asks for version 1. `base_digest`: the old
// view's digest if known (else computed on the GPU).
TERN_EXPORT Result<std::vector<uint8_t>> GpuDiff(const ServeView& old_device_view,
                                                 const ServeView& new_device_view, const DiffOptions& diff,
                                                 const GpuOptions& options,
                                                 const ViewDigest* base_digest = nullptr);

// A publisher that keeps the last published view itself (a copy in device
// memory, or in mapped pinned host memory when device memory is scarce) and
// turns each new device view into the patch from it. Not synchronized.
class TERN_EXPORT GpuPublisher {
 public:
  enum class Keep : uint8_t { kDevice, kPinnedHost };
  // Copies `initial` (a device view) as version `version`; its digest is
  // computed on the GPU.
  static Result<std::unique_ptr<GpuPublisher>> Create(const ServeView& initial, uint64_t version, Keep keep,
                                                      const GpuOptions& options);
  ~GpuPublisher();
  GpuPublisher(const GpuPublisher&) = delete;
  GpuPublisher& operator=(const GpuPublisher&) = delete;

  // The patch from the kept view to `current` (same layout; kMismatch
  // otherwise), encoded on the GPU; `current` then becomes the kept view at
  // `version`. diff.base_version/target_version are ignored (the kept
  // version and `version` are used).
  Result<std::vector<uint8_t>> Publish(const ServeView& current, uint64_t version, const DiffOptions& diff);
  const ViewDigest& digest() const { return digest_; }
  uint64_t version() const { return version_; }

 private:
  GpuPublisher() = default;
  std::vector<TensorDesc> descs_;
  std::vector<void*> buffers_;
  Keep keep_ = Keep::kDevice;
  GpuOptions options_;
  ViewDigest digest_;
  uint64_t version_ = 0;
  ServeView Kept() const;
};

// Serve view from master weights on the GPU (tern::Quantize's contract and
// bytes). `master` is a device array of `master_dtype` (F32 or BF16; BF16
// widens exactly) with shape [lead..., out, in]. `outputs` are device
// buffers for the tensors Quantize returns, in its order and byte layout
// (BF16/F16: the cast; FP8: codes, scales; NVFP4: codes, scales,
// scale_2, input_scale; NVFP4-CT: codes, scales, global; MXFP4: blocks,
// scales). With `has_previous` the scale buffers hold the previous state,
// which the scale policy reads before they are overwritten. NaN/Inf in the
// master: kInvalidArgument naming the first element, outputs untouched.
// INT4 (int4-g*, gptq-int4-g*; 2-D [out, in] only, as the CPU): outputs in
// Quantize's order (pack: packed I32, BF16 scales, I64 shape, zero points
// when asymmetric; GPTQ: qweight, F16 scales, qzeros, g_idx); a scale beyond
// its dtype is kOutOfRange with the outputs untouched.
struct GpuQuantStats {
  uint64_t rescaled_groups = 0;
  uint64_t scale_groups = 0;
};
TERN_EXPORT Result<GpuQuantStats> GpuQuantize(const QuantSpec& spec, DType master_dtype, const void* master,
                                              const std::vector<uint64_t>& shape, std::span<void* const> outputs,
                                              bool has_previous, const ScalePolicy& policy,
                                              const GpuOptions& options);

// ---- Receive: how received bytes reach GPU memory (docs/gpu.md, "Receive") --

// The ways, best first: the NIC writes into registered GPU memory (verbs with
// a dma-buf of the device memory, verbs with nvidia-peermem, UCX built with
// CUDA), else received bytes pass through pinned host slots and are copied
// up (GpuStagingUpload).
enum class GpuReceivePath : uint8_t { kVerbsDmaBuf, kVerbsPeermem, kUcxCuda, kStagingRing };
TERN_EXPORT const char* GpuReceivePathName(GpuReceivePath path);

struct GpuReceiveProbe {
  GpuReceivePath best = GpuReceivePath::kStagingRing;  // the best this machine offers
  // What tern uses: the staging ring, always for now (the transports do not
  // register device memory yet, whatever `best` says).
  GpuReceivePath used = GpuReceivePath::kStagingRing;
  bool device = false;  // a CUDA device to receive into (the ring needs one too)
  std::string reason;   // why each better path is out, and what was found
};
// Looks (no traffic, no allocation): CUDA devices, libibverbs and its
// ibv_reg_dmabuf_mr, RDMA devices, the nvidia_peermem module, UCX's CUDA
// transport module.
TERN_EXPORT GpuReceiveProbe ProbeGpuReceive();

// Received bytes to device memory through a ring of pinned host slots: the
// receiver fills one slot (Acquire, then Submit the bytes it put there) while
// the copies of earlier slots run on `options.stream`; with every slot in
// flight Acquire waits for the oldest copy (back-pressure, bounded memory:
// slots x slot_bytes of pinned memory). Bytes land at increasing offsets of
// `device_dst`; bytes_done() is the prefix known to be there (a consumer may
// start on it, e.g. decode the records it holds). Not thread safe.
class TERN_EXPORT GpuStagingUpload {
 public:
  static Result<std::unique_ptr<GpuStagingUpload>> Create(void* device_dst, uint64_t dst_bytes, int slots,
                                                          uint64_t slot_bytes, const GpuOptions& options);
  ~GpuStagingUpload();
  GpuStagingUpload(const GpuStagingUpload&) = delete;
  GpuStagingUpload& operator=(const GpuStagingUpload&) = delete;

  Result<std::span<uint8_t>> Acquire();
  Status Submit(uint64_t bytes);
  Status Push(std::span<const uint8_t> data);  // bytes the receiver holds elsewhere
  Status Drain();                              // waits for every copy
  uint64_t bytes_done() const;

  struct Impl;

 private:
  explicit GpuStagingUpload(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- Islands: several GPUs of one engine (docs/gpu.md, "Islands") ---------

// How a tensor is split over the ranks of a tensor-parallel island: rows of
// its [rows, cols] folding (cols = last dimension; a column-parallel linear
// and its bias), columns (a row-parallel linear), or replicated (norms).
// Equal shards, rank r holding the r-th; a rank's buffer holds its block
// row-major.
enum class GpuTpSplit : uint8_t { kReplicated, kRows, kCols };

// NCCL, loaded at run time (libnccl.so.2): one communicator per rank of an
// island. The rank that receives a patch broadcasts its bytes to the others.
class TERN_EXPORT NcclIsland {
 public:
  // The 128-byte id rank 0 creates and hands to every rank out of band.
  static Result<std::vector<uint8_t>> NewUniqueId();
  // Joins the island on the current CUDA device (blocks until all ranks join).
  static Result<NcclIsland> Join(int nranks, int rank, std::span<const uint8_t> unique_id);
  // NCCL's version (e.g. 22703) or kUnavailable naming what failed to load.
  static Result<int> LibraryVersion();

  NcclIsland(NcclIsland&& other) noexcept;
  NcclIsland& operator=(NcclIsland&& other) noexcept;
  NcclIsland(const NcclIsland&) = delete;
  NcclIsland& operator=(const NcclIsland&) = delete;
  ~NcclIsland();

  // Broadcasts `bytes` bytes of device memory from `root` into every rank's
  // `device_buffer` (stream-ordered on `stream`, a cudaStream_t).
  Status Broadcast(void* device_buffer, uint64_t bytes, int root, void* stream);
  // Delivers a patch from `root` to every rank (its size, then its bytes,
  // broadcast through a device buffer) and applies it with GpuApply to each
  // rank's `device_view`, which must be the patch's base: ranks that hold
  // replicas (tensor-parallel shards need the shard mapping of docs/gpu.md,
  // not built yet). `patch` is read on the root only. Collective: every rank
  // calls it with the same root.
  Status ApplyFromRoot(MutableServeView& device_view, std::span<const uint8_t> patch, int root,
                       const ViewDigest& current_digest, const GpuOptions& options,
                       ViewDigest* new_digest = nullptr);
  // Tensor-parallel ranks: the patch from `root` reaches every rank, and
  // each applies only its shards. device_view's tensors carry the full
  // tensors' descs (the patch's layout) and point at this rank's shard of
  // each (splits[t]: how tensor t is split); current_digest is the whole
  // island view's digest. Each rank decodes the records that touch its
  // shards and sums its partial digest change; the island all-reduces the
  // sums (and any rank's failure), so every rank writes or none does.
  // kUnsupported (on every rank) for a CONTEXT record that straddles a
  // shard: it decodes only against its whole segment's base, so publish
  // split tensors in format 1 or cut segments at shard boundaries.
  // Collective.
  Status ApplyShardsFromRoot(MutableServeView& device_view, std::span<const uint8_t> patch, int root,
                             const std::vector<GpuTpSplit>& splits, const ViewDigest& current_digest,
                             const GpuOptions& options, ViewDigest* new_digest = nullptr);
  // Sums `count` uint64 values of device memory over the island, in place
  // (mod 2^64, as the digest's lanes add).
  Status AllReduceSum(uint64_t* device_buffer, uint64_t count, void* stream);
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

 private:
  NcclIsland(void* comm, int nranks, int rank) : comm_(comm), nranks_(nranks), rank_(rank) {}
  void* comm_ = nullptr;  // ncclComm_t
  int nranks_ = 0, rank_ = 0;
};

}  // namespace tern
