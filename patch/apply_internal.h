// The two apply strategies behind tern::Apply, exposed for tests and the
// microbenchmark (tests exercise the staged, unstaged and exclusive paths).
#pragma once

#include <cstdint>
#include <span>

#include "patch/container.h"
#include "tern/patch.h"

namespace tern::patch {

// Bytes staged per decoded change: a u32 position and a u64 new value.
inline constexpr uint64_t kStagedChangeBytes = 12;
// Default budget: ~22M changes (1% of a ~4 GB BF16 view) apply in one decode.
inline constexpr uint64_t kApplyStagingBytes = uint64_t{256} << 20;

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
