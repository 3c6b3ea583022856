// Fuzzer: a rank part as the root's POST /publish/rank-part receives it
// (docs/format/agent.md §11). Anything the decoder accepts must encode back
// to the same bytes (one encoding of a valid part); nothing may crash, hang
// or allocate without bound.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "tern/rank_publish.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto part = tern::DecodeRankPart(std::span<const uint8_t>(data, size));
  if (!part.ok()) return 0;
  auto again = tern::EncodeRankPart(*part);
  TERN_ASSERT(again.ok());
  TERN_ASSERT(again->size() == size);
  TERN_ASSERT(std::equal(again->begin(), again->end(), data));
  return 0;
}
