// The additive view digest (spec: docs/format/patch.md, "Digest").
#include "tern/digest.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "tern/thread_pool.h"
#include "patch/digest_mix.h"
#include "patch/element_access.h"

namespace tern {
namespace {

using patch::Lane;
using patch::LaneAdd;
using patch::Mix64;

// Elements per parallel work item: large enough to amortize scheduling.
constexpr uint64_t kChunkElements = uint64_t{1} << 20;

// Blocked so each loop is a simple map or reduction over arrays, which the
// compiler vectorizes: several times faster than one element at a time with
// all four lanes interleaved. always_inline so that each caller below
// compiles it for its own instruction set.
template <int W>
[[gnu::always_inline]] inline void AccumulateBlocks(const uint8_t* data, uint64_t seed, uint64_t begin,
                                                    uint64_t end, uint64_t acc[4]) {
  constexpr uint64_t kBlock = 256;
  alignas(64) uint64_t u[kBlock];
  alignas(64) uint64_t v[kBlock];
  for (uint64_t b = begin; b < end; b += kBlock) {
    const uint64_t n = std::min(kBlock, end - b);
    for (uint64_t j = 0; j < n; ++j) {
      v[j] = patch::LoadElement<W>(data, b + j);
      u[j] = Mix64((b + j) ^ seed);
    }
    for (int l = 0; l < 4; ++l) {
      const uint64_t add = LaneAdd(l), mul = patch::LaneMul(l);
      uint64_t sum = 0;
      for (uint64_t j = 0; j < n; ++j) {
        const uint64_t t = (v[j] ^ (u[j] + add)) * mul;
        sum += t ^ (t >> 29);
      }
      acc[l] += sum;
    }
  }
}

// The build's floor (x86-64-v3) has no 64-bit vector multiply: AVX2
// emulates each of the six per element with three 32-bit ones. Where the
// CPU has AVX-512DQ (vpmullq), the same loop compiled for it is used,
// chosen at run time (a capability probe, not a build option): the digest
// is the root's D(prev) check and every member's scrub. The sums are the
// same integers either way (the golden files pin them).
template <int W>
void AccumulateRange(const uint8_t* data, uint64_t seed, uint64_t begin, uint64_t end, uint64_t acc[4]) {
  AccumulateBlocks<W>(data, seed, begin, end, acc);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TERN_DIGEST_AVX512 1
template <int W>
[[gnu::target("avx512f,avx512dq,avx512vl,avx512bw")]] void AccumulateRangeAvx512(
    const uint8_t* data, uint64_t seed, uint64_t begin, uint64_t end, uint64_t acc[4]) {
  AccumulateBlocks<W>(data, seed, begin, end, acc);
}

// The compiler's probe also checks that the OS saves the AVX-512 state.
bool HasAvx512() {
  static const bool has = [] {
    __builtin_cpu_init();  // in case a static initializer digests before main
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  }();
  return has;
}
#endif

template <int W>
void AccumulateWidth(const uint8_t* data, uint64_t seed, uint64_t begin, uint64_t end, uint64_t acc[4]) {
#if TERN_DIGEST_AVX512
  if (HasAvx512()) return AccumulateRangeAvx512<W>(data, seed, begin, end, acc);
#endif
  AccumulateRange<W>(data, seed, begin, end, acc);
}

void AccumulateAny(const TensorRef& t, uint64_t seed, uint64_t begin, uint64_t end, uint64_t acc[4]) {
  switch (ElementBits(t.desc->dtype)) {
    case 4: return AccumulateWidth<4>(t.data, seed, begin, end, acc);
    case 8: return AccumulateWidth<8>(t.data, seed, begin, end, acc);
    case 16: return AccumulateWidth<16>(t.data, seed, begin, end, acc);
    case 32: return AccumulateWidth<32>(t.data, seed, begin, end, acc);
    default: return AccumulateWidth<64>(t.data, seed, begin, end, acc);
  }
}

}  // namespace

namespace patch {
void AccumulateElements(const TensorRef& tensor, uint64_t seed, uint64_t begin, uint64_t end,
                        uint64_t acc[4]) {
  AccumulateAny(tensor, seed, begin, end, acc);
}

bool AccumulateElementsPortable(const TensorRef& tensor, uint64_t seed, uint64_t begin,
                                uint64_t end, uint64_t acc[4]) {
  switch (ElementBits(tensor.desc->dtype)) {
    case 4: AccumulateRange<4>(tensor.data, seed, begin, end, acc); break;
    case 8: AccumulateRange<8>(tensor.data, seed, begin, end, acc); break;
    case 16: AccumulateRange<16>(tensor.data, seed, begin, end, acc); break;
    case 32: AccumulateRange<32>(tensor.data, seed, begin, end, acc); break;
    default: AccumulateRange<64>(tensor.data, seed, begin, end, acc); break;
  }
#if TERN_DIGEST_AVX512
  return HasAvx512();
#else
  return false;
#endif
}
}  // namespace patch

std::array<uint8_t, 32> ViewDigest::Bytes() const {
  std::array<uint8_t, 32> out;
  std::memcpy(out.data(), lanes.data(), 32);  // little-endian host (patch/format.h)
  return out;
}

ViewDigest ViewDigest::FromBytes(const uint8_t* bytes32) {
  ViewDigest d;
  std::memcpy(d.lanes.data(), bytes32, 32);
  return d;
}

std::string ViewDigest::ToString() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "tern1:";
  for (uint8_t b : Bytes()) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

Result<ViewDigest> ViewDigest::Parse(std::string_view text) {
  TERN_REQUIRE(text.size() == 6 + 64 && text.substr(0, 6) == "tern1:", kInvalidArgument,
               "digest must be 'tern1:' followed by 64 hex digits");
  uint8_t bytes[32];
  for (int i = 0; i < 32; ++i) {
    int v = 0;
    for (int j = 0; j < 2; ++j) {
      const char c = text[6 + 2 * i + j];
      int x;
      if (c >= '0' && c <= '9') x = c - '0';
      else if (c >= 'a' && c <= 'f') x = c - 'a' + 10;
      else return TERN_ERROR(kInvalidArgument, "digest: bad hex digit '", c, "'");
      v = v * 16 + x;
    }
    bytes[i] = static_cast<uint8_t>(v);
  }
  return FromBytes(bytes);
}

uint64_t TensorSeed(const TensorDesc& desc) {
  std::vector<uint8_t> buf(desc.name.begin(), desc.name.end());
  buf.push_back(static_cast<uint8_t>(desc.dtype));
  buf.push_back(static_cast<uint8_t>(desc.shape.size()));
  for (uint64_t d : desc.shape) {
    uint8_t le[8];
    std::memcpy(le, &d, 8);
    buf.insert(buf.end(), le, le + 8);
  }
  return XXH3_64bits(buf.data(), buf.size());
}

ViewDigest ElementHash(uint64_t seed, uint64_t index, uint64_t value) {
  const uint64_t u = Mix64(index ^ seed);
  ViewDigest d;
  for (int l = 0; l < 4; ++l) d.lanes[l] = Lane(l, u, value);
  return d;
}

ViewDigest TensorTerm(uint64_t seed) {
  ViewDigest d;
  for (int l = 0; l < 4; ++l) d.lanes[l] = Mix64(seed + LaneAdd(l));
  return d;
}

ViewDigest ComputeElementTerms(const TensorRef& tensor, uint64_t begin, uint64_t end) {
  uint64_t acc[4] = {0, 0, 0, 0};
  AccumulateAny(tensor, TensorSeed(*tensor.desc), begin, end, acc);
  return ViewDigest{{acc[0], acc[1], acc[2], acc[3]}};
}

ViewDigest ComputeTensorDigest(const TensorRef& tensor) {
  const uint64_t seed = TensorSeed(*tensor.desc);
  ViewDigest d = TensorTerm(seed);
  AccumulateAny(tensor, seed, 0, tensor.desc->elements(), d.lanes.data());
  return d;
}

ViewDigest ComputeDigest(const ServeView& view, ThreadPool& pool) {
  struct Item {
    size_t tensor;
    uint64_t begin, end;
  };
  std::vector<Item> items;
  std::vector<uint64_t> seeds(view.tensors.size());
  ViewDigest total;
  for (size_t t = 0; t < view.tensors.size(); ++t) {
    seeds[t] = TensorSeed(*view.tensors[t].desc);
    total += TensorTerm(seeds[t]);
    const uint64_t n = view.tensors[t].desc->elements();
    for (uint64_t b = 0; b < n; b += kChunkElements) items.push_back({t, b, std::min(n, b + kChunkElements)});
  }
  std::vector<ViewDigest> partial(items.size());
  pool.ParallelFor(items.size(), [&](uint64_t k) {
    const Item& it = items[k];
    AccumulateAny(view.tensors[it.tensor], seeds[it.tensor], it.begin, it.end, partial[k].lanes.data());
  });
  for (const ViewDigest& p : partial) total += p;
  return total;
}

}  // namespace tern
