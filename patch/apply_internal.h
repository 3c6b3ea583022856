// Apply with an explicit staging budget (tests exercise both paths).
#pragma once

#include <cstdint>
#include <span>

#include "tern/patch.h"

namespace tern::patchfmt {

// Bytes staged per decoded change: a u32 position and a u64 new value.
inline constexpr uint64_t kStagedChangeBytes = 12;
// Default budget: ~22M changes (1% of a ~4 GB BF16 view) apply in one decode.
inline constexpr uint64_t kApplyStagingBytes = uint64_t{256} << 20;

Status ApplyWithStaging(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
                        ThreadPool& pool, ViewDigest* new_digest, uint64_t staging_bytes_max);

}  // namespace tern::patchfmt
