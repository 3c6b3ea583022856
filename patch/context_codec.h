// The CONTEXT segment encoding of format 2 (docs/format/patch.md §6.4):
// positions and values coded given the base.
//
// Every element of a segment falls into one of K classes computed from its
// *base* value, clamp(e0 - exponent field, 0, K-1): class 0 holds the largest
// magnitudes, which change least often (an element flips when the master's
// push crosses a rounding step, and the step grows with |w|). Each class has
// its own Rice parameter for the gaps between its changes, counted in class
// members, and its own Huffman table for their values. The receiver holds the
// base, so it recomputes the classes; a patch pays only for what the base
// does not already say.
//
// Speed: the decoder walks the segment in blocks of kContextBlock elements;
// per block it reads the base once (the classes), builds one bit mask per
// class and finds each change by a rank directory (a class's members before
// each mask word) and a select in one word: no branch per word, so the
// unpredictable gaps between changes cost no mispredictions. The block is in
// L1 while its changes are applied, so the apply streams through the view
// instead of missing the cache once per change.
//
// Writes during decoding: the decoder reads every base element of block b
// before it emits a change in block b and never reads block b again, so `fn`
// may write any element it has been given (the apply paths do).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "patch/element_access.h"
#include "patch/segment_codec.h"
#include "tern/dtype.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace tern::patch {

ContextField ContextFieldOf(DType dtype);

inline constexpr uint64_t kContextBlock = 4096;  // elements
inline constexpr uint64_t kContextBlockWords = kContextBlock / 64;

struct ContextClass {
  uint64_t changes = 0;
  int rice_k = 0;
  const uint8_t* positions = nullptr;
  uint32_t position_bytes = 0;
  const uint8_t* values = nullptr;
  uint32_t value_bytes = 0;
  uint8_t lengths[kSymbols] = {};
};

struct ContextTable {
  int classes = 0;  // K
  uint32_t e0 = 0;
  ContextClass cls[kMaxClasses];
};

// Parses and checks the context table of a CONTEXT record: K in 2..16,
// per-class counts summing to changed_count, substream lengths summing to
// position_bytes / value_bytes, valid code tables, canonical varints.
Status ParseContextTable(const RecordView& r, ContextTable* t);

// Class of every element [first, first + n) of a tensor (n <= kContextBlock)
// into cls[0..n); cls is then zero-padded to a multiple of 64. e0 <= 4095
// (ParseContextTable); the 8-bit vector path needs e0 < 256 and leaves the
// rest to the scalar loop.
template <int W>
inline void ComputeClasses(const uint8_t* tensor, uint64_t first, uint64_t n, ContextField f,
                           uint32_t e0, int classes, uint8_t* cls) {
  uint64_t i = 0;
#if defined(__AVX2__)
  const int top = classes - 1;
  // 32 elements a step: max(e0 - x, 0) by a saturating subtraction, then the
  // top class by an unsigned min. The hot path of CONTEXT decode and encode.
  if constexpr (W == 16) {
    const uint8_t* p = tensor + first * 2;
    const __m128i shift = _mm_cvtsi32_si128(f.shift);
    const __m256i mask = _mm256_set1_epi16(static_cast<int16_t>(f.mask));
    const __m256i e0v = _mm256_set1_epi16(static_cast<int16_t>(e0));
    const __m256i topv = _mm256_set1_epi16(static_cast<int16_t>(top));
    for (; i + 32 <= n; i += 32) {
      __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i));
      __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i + 32));
      a = _mm256_min_epu16(_mm256_subs_epu16(e0v, _mm256_and_si256(_mm256_srl_epi16(a, shift), mask)), topv);
      b = _mm256_min_epu16(_mm256_subs_epu16(e0v, _mm256_and_si256(_mm256_srl_epi16(b, shift), mask)), topv);
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(cls + i), packed);
    }
  } else if (W == 8 && e0 < 256) {
    const uint8_t* p = tensor + first;
    const __m128i shift = _mm_cvtsi32_si128(f.shift);
    const __m256i mask = _mm256_set1_epi8(static_cast<int8_t>(f.mask));
    const __m256i e0v = _mm256_set1_epi8(static_cast<int8_t>(e0));
    const __m256i topv = _mm256_set1_epi8(static_cast<int8_t>(top));
    for (; i + 32 <= n; i += 32) {
      // A 16-bit shift brings the neighbour byte's bits into the top of each
      // byte; the field mask clears them.
      __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
      a = _mm256_min_epu8(_mm256_subs_epu8(e0v, _mm256_and_si256(_mm256_srl_epi16(a, shift), mask)), topv);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(cls + i), a);
    }
  }
#endif
  for (; i < n; ++i)
    cls[i] = static_cast<uint8_t>(
        format::ContextClassOf(LoadElement<W>(tensor, first + i), f, e0, classes));
  const uint64_t padded = (n + 63) / 64 * 64;
  if (padded > n) std::memset(cls + n, 0, padded - n);
}

// masks[c][j] bit b: element 64j + b of the block is in class c (b < n).
// Rows from `classes` up to the next power of two are written too (zero).
// Built from bit planes of the class bytes, so the cost is one pass of
// log2(K) movemasks plus a few word operations per class per 64 elements.
void ClassMasks(const uint8_t* cls, uint64_t n, int classes, uint64_t masks[kMaxClasses][kContextBlockWords]);
// The same, one bit at a time: the oracle for the fast version in tests.
void ClassMasksScalar(const uint8_t* cls, uint64_t n, int classes,
                      uint64_t masks[kMaxClasses][kContextBlockWords]);

#if defined(__AVX2__)
// ComputeClasses<16> and ClassMasks of one whole block (kContextBlock
// elements at `block`) in one pass, the class bytes kept in registers.
void ClassMasksOfBlock16(const uint8_t* block, ContextField f, uint32_t e0, int classes,
                         uint64_t masks[kMaxClasses][kContextBlockWords]);
#endif

// ComputeClasses then ClassMasks of n <= kContextBlock elements from
// `first`; `cls` is scratch (kContextBlock bytes). Whole 16-bit blocks take
// the fused AVX2 path; the rest, and machines without AVX2, the two passes
// (context_codec_test checks that both give the same masks).
template <int W>
inline void BaseClassMasks(const uint8_t* tensor, uint64_t first, uint64_t n, ContextField f,
                           uint32_t e0, int classes, uint8_t* cls,
                           uint64_t masks[kMaxClasses][kContextBlockWords]) {
#if defined(__AVX2__)
  if constexpr (W == 16) {
    if (n == kContextBlock) return ClassMasksOfBlock16(tensor + first * 2, f, e0, classes, masks);
  }
#endif
  ComputeClasses<W>(tensor, first, n, f, e0, classes, cls);
  ClassMasks(cls, n, classes, masks);
}

// Index of the (r+1)-th set bit of x (r < popcount(x)).
inline int SelectBit(uint64_t x, uint64_t r) {
#if defined(__BMI2__)
  return std::countr_zero(_pdep_u64(uint64_t{1} << r, x));
#else
  for (; r > 0; --r) x &= x - 1;
  return std::countr_zero(x);
#endif
}

// The rank directory of one class in one block: before[j] = members of the
// class (set bits of m) in words 0 .. j-1, for j < words; returns all the
// block's members. The caller fills before[words ..] with 0xffff, so that
// WordOfRank never picks a word past the block.
inline uint64_t RankDirectory(const uint64_t* m, uint64_t words, uint16_t* before) {
  uint32_t run = 0;
  for (uint64_t j = 0; j < words; ++j) {
    before[j] = static_cast<uint16_t>(run);
    run += static_cast<uint32_t>(std::popcount(m[j]));
  }
  return run;
}

// The members of a class in one block (set bits of m[0 .. words)), for
// every class without a change in the block: four independent sums, so the
// popcounts do not wait on one chain of adds.
inline uint64_t CountMembers(const uint64_t* m, uint64_t words) {
  uint64_t s[4] = {};
  uint64_t j = 0;
  for (; j + 4 <= words; j += 4)
    for (int k = 0; k < 4; ++k) s[k] += static_cast<uint64_t>(std::popcount(m[j + k]));
  for (; j < words; ++j) s[0] += static_cast<uint64_t>(std::popcount(m[j]));
  return s[0] + s[1] + s[2] + s[3];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// CountMembers and RankDirectory with AVX-512's vector popcount, for CPUs
// that have it (HaveVectorPopcount, asked once; the build's floor is
// x86-64-v3): eight words a vector instead of one a popcount. Whole blocks
// only; others take the scalar loops.
bool HaveVectorPopcount();
uint64_t CountMembersAvx512(const uint64_t* m, uint64_t words);
uint64_t RankDirectoryAvx512(const uint64_t* m, uint64_t words, uint16_t* before);
#define TERN_CONTEXT_VPOPCNT 1
#endif

// The word that holds the member of block-relative rank r (r < members):
// the last j with before[j] <= r. A binary search of six steps written as
// selects (for conditional moves, not branches): the ranks of a class's
// changes jump unpredictably, and a branch per step would mispredict.
inline uint64_t WordOfRank(const uint16_t before[kContextBlockWords], uint64_t r) {
  static_assert(kContextBlockWords == 64);
  uint64_t j = 0;
  for (uint64_t step = 32; step > 0; step /= 2) j = before[j + step] <= r ? j + step : j;
  return j;
}

// A class's value code. Up to 16 classes per record: a full table of
// 2^(longest code) entries each (up to 64 KiB) would cost more to build than
// the class has values, so the table covers codes up to kCapBits and longer
// ones (rare by construction) are decoded bit by bit, canonically (the
// GPU's decoder, format/record.h).
struct ClassValueDecoder {
  static constexpr int kCapBits = 8;
  int bits = 0;                          // table index bits: min(longest code, kCapBits)
  uint16_t table[1 << kCapBits] = {};    // symbol << 4 | length, 0: longer code or none
  format::CanonicalDecoder canonical;
};
void BuildClassValueDecoder(const uint8_t lengths[kSymbols], ClassValueDecoder* d);

// Reads one zigzag value (non-zero, of at most w bits) or fails.
[[gnu::always_inline]] inline bool DecodeClassValue(BitReader& in, const ClassValueDecoder& d, int w, uint64_t* z) {
  // Fast path: one unchecked load while the stream has room; anything it
  // cannot finish within that load goes to the checked path below.
  if (in.FastReads() > 0) [[likely]] {
    const uint64_t bits = in.PeekFast();
    const uint16_t e = d.table[bits & ((uint64_t{1} << d.bits) - 1)];
    if (e != 0) {
      const int code_len = e & 15, sym = e >> 4;
      if (sym < kLiteralSymbols) {
        if (sym == 0 || static_cast<uint64_t>(sym) > WidthMask(w)) return false;
        in.Skip(code_len);
        *z = static_cast<uint64_t>(sym);
        return true;
      }
      const int len = format::SymbolValueBits(sym);
      if (len > w) return false;
      if (code_len + len - 1 <= 56) {
        in.Skip(code_len + len - 1);
        *z = (uint64_t{1} << (len - 1)) | ((bits >> code_len) & WidthMask(len - 1));
        return true;
      }
    }
  }
  int sym;
  const uint16_t e = d.table[in.Peek(d.bits)];
  if (e != 0) [[likely]] {
    in.Skip(e & 15);
    sym = e >> 4;
  } else {
    sym = format::DecodeSymbol(in, d.canonical);
    if (sym < 0 || in.Overrun()) return false;
  }
  return sym != 0 && format::ReadSymbolValue(in, sym, w, z);  // zero: not a change
}

// Decodes a CONTEXT record against the base tensor, calling fn(position in
// segment, delta) once per change: block by block, within a block class by
// class (so not in position order). Validates every stream; a class rank past
// the class's members in the segment is kCorrupt.
template <int W, class Fn>
Status DecodeContext(const RecordView& r, const uint8_t* tensor, ContextField f, Fn&& fn) {
  ContextTable t;
  TERN_RETURN_IF_ERROR(ParseContextTable(r, &t));
  const uint64_t count = r.h.element_count;
  const uint64_t first = r.h.first_element;
  const int K = t.classes;
  struct Live {
    BitReader pos{nullptr, 0}, val{nullptr, 0};
    ClassValueDecoder dec;
    uint64_t left = 0;  // changes still to emit
    uint64_t skip = 0;  // class members before the next change
    int k = 0;
  };
  Live live[kMaxClasses];
  auto read_gap = [&](Live& l, uint64_t* gap) {
    if (l.pos.FastReads() > 0) [[likely]] {  // one unchecked load (see DecodeClassValue)
      const uint64_t bits = l.pos.PeekFast();
      const int q = std::countr_zero(bits);
      if (q + 1 + l.k <= 56) {
        const uint64_t g = (static_cast<uint64_t>(q) << l.k) | ((bits >> (q + 1)) & WidthMask(l.k));
        if (g < count) {
          l.pos.SkipBits(static_cast<uint64_t>(q + 1 + l.k));
          *gap = g;
          return true;
        }
      }
    }
    return format::ReadRice(l.pos, l.k, count, gap) && !l.pos.Overrun() && *gap < count;
  };
  int active = 0;
  for (int c = 0; c < K; ++c) {
    const ContextClass& cc = t.cls[c];
    Live& l = live[c];
    l.left = cc.changes;
    if (l.left == 0) continue;
    ++active;
    l.k = cc.rice_k;
    l.pos = BitReader(cc.positions, cc.position_bytes);
    l.val = BitReader(cc.values, cc.value_bytes);
    BuildClassValueDecoder(cc.lengths, &l.dec);
    if (!read_gap(l, &l.skip)) return TERN_ERROR(kCorrupt, "CONTEXT segment: bad position code in class ", c);
  }
  alignas(64) uint8_t cls[kContextBlock];
  alignas(64) uint64_t masks[kMaxClasses][kContextBlockWords];
  alignas(64) uint16_t before[kContextBlockWords];  // class members in the words before word j
#if TERN_CONTEXT_VPOPCNT
  const bool vpopcnt = HaveVectorPopcount();
#endif
  auto count_members = [&](const uint64_t* m, uint64_t words) {
#if TERN_CONTEXT_VPOPCNT
    if (vpopcnt) return CountMembersAvx512(m, words);
#endif
    return CountMembers(m, words);
  };
  auto rank_directory = [&](const uint64_t* m, uint64_t words) {
#if TERN_CONTEXT_VPOPCNT
    if (vpopcnt) return RankDirectoryAvx512(m, words, before);
#endif
    return RankDirectory(m, words, before);
  };
  for (uint64_t b0 = 0; b0 < count && active > 0; b0 += kContextBlock) {
    const uint64_t n = std::min(kContextBlock, count - b0);
    const uint64_t words = (n + 63) / 64;
    BaseClassMasks<W>(tensor, first + b0, n, f, t.e0, K, cls, masks);
    if (words < kContextBlockWords) std::fill(before + words, before + kContextBlockWords, uint16_t{0xffff});
    for (int c = 0; c < K; ++c) {
      Live& l = live[c];
      if (l.left == 0) continue;
      const uint64_t* m = masks[c];
      if (l.skip >= n) {  // no change of this class in the block: its members only count
        l.skip -= count_members(m, words);
        continue;
      }
      const uint64_t members = rank_directory(m, words);
      // rank: the block-relative rank, within class c, of the next change.
      uint64_t rank = l.skip;
      while (rank < members) {
        const uint64_t j = WordOfRank(before, rank);
        const int bit = SelectBit(m[j], rank - before[j]);
        uint64_t z;
        if (!DecodeClassValue(l.val, l.dec, W, &z) || l.val.Overrun())
          return TERN_ERROR(kCorrupt, "CONTEXT segment: bad value code in class ", c);
        fn(b0 + j * 64 + static_cast<uint64_t>(bit), UnZigZag(z, W));
        if (--l.left == 0) {
          --active;
          break;
        }
        uint64_t gap;
        if (!read_gap(l, &gap)) return TERN_ERROR(kCorrupt, "CONTEXT segment: bad position code in class ", c);
        rank += gap + 1;  // gap < 2^24: no overflow
      }
      l.skip = rank - std::min(rank, members);
    }
  }
  for (int c = 0; c < K; ++c) {
    TERN_REQUIRE(live[c].left == 0, kCorrupt, "CONTEXT segment: class ", c,
                 " position past the class's elements (wrong base?)");
    if (t.cls[c].changes == 0) continue;
    TERN_REQUIRE(live[c].pos.FinishedCleanly() && live[c].val.FinishedCleanly(), kCorrupt,
                 "CONTEXT segment: class ", c, " streams not cleanly consumed");
  }
  return Status::Ok();
}

// Decodes any record: CONTEXT against the base tensor, the others without it.
template <class Fn>
Status DecodeRecordOnBase(const RecordView& r, int w, const uint8_t* tensor, ContextField f, Fn&& fn) {
  if (r.h.encoding != kContext) return DecodeRecord(r, w, fn);
  return DispatchWidth(w, [&]<int W>() { return DecodeContext<W>(r, tensor, f, fn); });
}

// Checks a CONTEXT record's streams without the base (Inspect, squash of
// other encodings): every code decodes, class ranks stay below element_count,
// every stream is consumed exactly. What needs the base (a rank past its
// class's members) is checked when the record is applied.
Status ValidateContextStreams(const RecordView& r, int w);

// Encodes the changes as a CONTEXT record payload if that is smaller than
// `limit_bytes` (table + streams); returns false otherwise (then nothing is
// written to `out`). positions: sorted, relative to `first`.
// out receives: table, then the position substreams, then the value substreams;
// *table_bytes etc. say how long each part is.
struct ContextPayload {
  std::vector<uint8_t> bytes;
  uint32_t table_bytes = 0, position_bytes = 0, value_bytes = 0;
};
bool EncodeContext(const uint64_t* positions, const uint64_t* deltas, uint64_t n, int w, const uint8_t* tensor,
                   ContextField f, int max_classes, uint64_t first, uint64_t count, uint64_t limit_bytes,
                   ContextPayload* out);

}  // namespace tern::patch
