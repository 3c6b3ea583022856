// The two apply strategies behind tern::Apply, exposed for tests and the
// microbenchmark (tests exercise the staged, unstaged and exclusive paths).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "patch/container.h"
#include "tern/patch.h"

namespace tern::patch {

// Bytes staged per decoded change: a u32 position and a u64 new value.
inline constexpr uint64_t kStagedChangeBytes = 12;
// Default budget: ~22M changes (1% of a ~4 GB BF16 view) apply in one decode.
inline constexpr uint64_t kApplyStagingBytes = uint64_t{256} << 20;

// The changes an apply keeps (ApplyWithStaging's staged new values, the
// exclusive path's written deltas for an undo), for every record of a patch in
// one allocation: record k's are at [start(k), start(k) + changed_count(k)).
// Kept memory is fresh for each apply, and faulting it in 4 KiB pages cost as
// much as the decode itself at 1% changed (docs/benchmarks.md, "Format 2
// decode + apply"), so an arena of 2 MiB or more is aligned and advised as
// transparent huge pages (where the kernel allows them; otherwise nothing
// changes). Not zero-filled: every slot up to a record's validated count is
// written before it is read.
class ChangeArena {
 public:
  // Room for every record's changed_count positions (u32, relative to the
  // segment) and values (u64).
  explicit ChangeArena(const ParsedPatch& p);
  ~ChangeArena();
  ChangeArena(const ChangeArena&) = delete;
  ChangeArena& operator=(const ChangeArena&) = delete;

  uint32_t* positions(uint64_t k) { return positions_ + start_[k]; }
  uint64_t* values(uint64_t k) { return values_ + start_[k]; }

 private:
  std::vector<uint64_t> start_;  // per record
  uint8_t* memory_ = nullptr;
  uint64_t bytes_ = 0;
  uint32_t* positions_ = nullptr;
  uint64_t* values_ = nullptr;
};

// Verify, then write (the default): decodes every change and checks the
// target digest with the view untouched, then writes. Changes are staged when
// they fit staging_bytes_max, else decoded a second time.
Status ApplyWithStaging(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
                        ThreadPool& pool, ViewDigest* new_digest, uint64_t staging_bytes_max);

// ApplyOptions::exclusive_view: one pass that reads, hashes and writes each
// change; on failure every written change is subtracted again. O(1) memory
// per thread. Same errors as ApplyWithStaging.
Status ApplyExclusive(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
                      ThreadPool& pool, ViewDigest* new_digest);

// The same on a patch the caller has parsed (and so checked) once already,
// e.g. ApplyCheckpoint, which reads the base digest before it stages a copy.
// `patch`'s records point into the caller's bytes, which must outlive the call.
Status ApplyParsed(MutableServeView& view, const ParsedPatch& patch, const ViewDigest& current_digest,
                   ThreadPool& pool, const ApplyOptions& options, ViewDigest* new_digest);
Status ApplyWithStaging(MutableServeView& view, const ParsedPatch& patch, const ViewDigest& current_digest,
                        ThreadPool& pool, ViewDigest* new_digest, uint64_t staging_bytes_max);
Status ApplyExclusive(MutableServeView& view, const ParsedPatch& patch, const ViewDigest& current_digest,
                      ThreadPool& pool, ViewDigest* new_digest);

}  // namespace tern::patch
