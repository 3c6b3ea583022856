#include "patch/context_codec.h"

#include <algorithm>
#include <cmath>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>  // AVX2 paths, and AVX-512 ones chosen at run time
#endif

namespace tern::patch {
namespace {

double Entropy2(double p) { return p <= 0 || p >= 1 ? 0.0 : -(p * std::log2(p) + (1 - p) * std::log2(1 - p)); }

}  // namespace

ContextField ContextFieldOf(DType dtype) {
  return format::ContextFieldOfCode(static_cast<int>(dtype));
}

Status ParseContextTable(const RecordView& r, ContextTable* t) {
  format::ContextLayout layout;
  if (const char* why = format::ParseContextLayout(r.h, r.table, &layout))
    return TERN_ERROR(kCorrupt, why);
  t->classes = layout.classes;
  t->e0 = layout.e0;
  for (int c = 0; c < t->classes; ++c) {
    const format::ContextClassLayout& l = layout.cls[c];
    ContextClass& cc = t->cls[c];
    cc = ContextClass{};
    cc.changes = l.changes;
    if (cc.changes == 0) continue;
    cc.rice_k = l.rice_k;
    cc.positions = r.positions + l.position_at;
    cc.position_bytes = l.position_bytes;
    cc.values = r.values + l.value_at;
    cc.value_bytes = l.value_bytes;
    TERN_RETURN_IF_ERROR(ParseCodeLengths(r.table + l.table_at, l.table_bytes, cc.lengths));
  }
  return Status::Ok();
}

void ClassMasksScalar(const uint8_t* cls, uint64_t n, int classes,
                      uint64_t masks[kMaxClasses][kContextBlockWords]) {
  const uint64_t words = (n + 63) / 64;
  for (int c = 0; c < classes; ++c)
    for (uint64_t j = 0; j < words; ++j) masks[c][j] = 0;
  for (uint64_t i = 0; i < n; ++i) masks[cls[i]][i / 64] |= uint64_t{1} << (i % 64);
}

namespace {

// Bit b of each of the 64 class bytes at p, as a word.
template <int B>
[[gnu::always_inline]] inline uint64_t Plane(const uint8_t* p) {
#if defined(__AVX2__)
  // A 16-bit shift moves bit B of every byte to that byte's top bit (the top
  // bit of each byte only ever receives that byte's own bit B).
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
  const uint32_t l = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(lo, 7 - B)));
  const uint32_t u = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(hi, 7 - B)));
  return uint64_t{l} | (uint64_t{u} << 32);
#else
  uint64_t x = 0;
  for (int i = 0; i < 64; ++i) x |= uint64_t{(p[i] >> B) & 1u} << i;
  return x;
#endif
}

// The 2^P class masks of one word from its P bit planes (b[B]: bit B of
// each element's class), limited to `valid`: 2^(P+1) - 2 and/andn.
template <int P>
[[gnu::always_inline]] inline void SplitPlanes(const uint64_t b[4], uint64_t valid,
                                               uint64_t m[16]) {
  if constexpr (P == 1) {
    m[0] = valid & ~b[0], m[1] = valid & b[0];
  } else if constexpr (P == 2) {
    const uint64_t h0 = valid & ~b[1], h1 = valid & b[1];
    m[0] = h0 & ~b[0], m[1] = h0 & b[0], m[2] = h1 & ~b[0], m[3] = h1 & b[0];
  } else if constexpr (P == 3) {
    const uint64_t q0 = valid & ~b[2], q1 = valid & b[2];
    const uint64_t h[4] = {q0 & ~b[1], q0 & b[1], q1 & ~b[1], q1 & b[1]};
    for (int t = 0; t < 4; ++t) m[2 * t] = h[t] & ~b[0], m[2 * t + 1] = h[t] & b[0];
  } else {
    const uint64_t q0 = valid & ~b[3], q1 = valid & b[3];
    const uint64_t r[4] = {q0 & ~b[2], q0 & b[2], q1 & ~b[2], q1 & b[2]};
    uint64_t h[8];
    for (int t = 0; t < 4; ++t) h[2 * t] = r[t] & ~b[1], h[2 * t + 1] = r[t] & b[1];
    for (int t = 0; t < 8; ++t) m[2 * t] = h[t] & ~b[0], m[2 * t + 1] = h[t] & b[0];
  }
}

// Word j of every plane's mask, those past the classes included (zero: no
// class byte reaches them), so no store waits on a compare and a branch.
template <int P>
[[gnu::always_inline]] inline void StoreMasks(const uint64_t m[16], uint64_t j,
                                              uint64_t masks[kMaxClasses][kContextBlockWords]) {
  for (int c = 0; c < (1 << P); ++c) masks[c][j] = m[c];
}

// P bit planes, 2^P classes, everything unrolled so the split stays in
// registers: P movemask pairs, 2^(P+1) - 2 and/andn, 2^P stores per word.
template <int P>
void ClassMasksPlanes(const uint8_t* cls, uint64_t n,
                      uint64_t masks[kMaxClasses][kContextBlockWords]) {
  const uint64_t words = (n + 63) / 64;
  for (uint64_t j = 0; j < words; ++j) {
    const uint8_t* p = cls + 64 * j;
    const uint64_t valid = (j + 1) * 64 <= n ? ~uint64_t{0} : (uint64_t{1} << (n % 64)) - 1;
    uint64_t b[4] = {};
    b[0] = Plane<0>(p);
    if constexpr (P > 1) b[1] = Plane<1>(p);
    if constexpr (P > 2) b[2] = Plane<2>(p);
    if constexpr (P > 3) b[3] = Plane<3>(p);
    uint64_t m[16];
    SplitPlanes<P>(b, valid, m);
    StoreMasks<P>(m, j, masks);
  }
}

#if defined(__AVX2__)
// Bit B of each class byte of the 64 in (lo, hi), as a word.
template <int B>
[[gnu::always_inline]] inline uint64_t PlaneOf(__m256i lo, __m256i hi) {
  const uint32_t l = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(lo, 7 - B)));
  const uint32_t u = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(hi, 7 - B)));
  return uint64_t{l} | (uint64_t{u} << 32);
}

// ComputeClasses<16> and ClassMasksPlanes<P> of a whole block in one pass:
// the class bytes of 64 elements stay in registers instead of a round trip
// through the class array.
template <int P>
void ClassMasks16Planes(const uint8_t* p, ContextField f, uint32_t e0, int classes,
                        uint64_t masks[kMaxClasses][kContextBlockWords]) {
  const __m128i shift = _mm_cvtsi32_si128(f.shift);
  const __m256i mask = _mm256_set1_epi16(static_cast<int16_t>(f.mask));
  const __m256i e0v = _mm256_set1_epi16(static_cast<int16_t>(e0));
  const __m256i topv = _mm256_set1_epi16(static_cast<int16_t>(classes - 1));
  auto classes_of = [&](const uint8_t* at) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
    return _mm256_min_epu16(
        _mm256_subs_epu16(e0v, _mm256_and_si256(_mm256_srl_epi16(v, shift), mask)), topv);
  };
  for (uint64_t j = 0; j < kContextBlockWords; ++j) {
    const uint8_t* at = p + 128 * j;
    const __m256i lo =
        _mm256_permute4x64_epi64(_mm256_packus_epi16(classes_of(at), classes_of(at + 32)), 0xd8);
    const __m256i hi = _mm256_permute4x64_epi64(
        _mm256_packus_epi16(classes_of(at + 64), classes_of(at + 96)), 0xd8);
    uint64_t b[4] = {};
    b[0] = PlaneOf<0>(lo, hi);
    if constexpr (P > 1) b[1] = PlaneOf<1>(lo, hi);
    if constexpr (P > 2) b[2] = PlaneOf<2>(lo, hi);
    if constexpr (P > 3) b[3] = PlaneOf<3>(lo, hi);
    uint64_t m[16];
    SplitPlanes<P>(b, ~uint64_t{0}, m);
    StoreMasks<P>(m, j, masks);
  }
}
#endif

}  // namespace

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
bool HaveVectorPopcount() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vpopcntdq");
  }();
  return have;
}

// GCC 12's AVX-512 headers warn that their own _mm*_undefined results may
// be used uninitialized (a known false positive of the intrinsics).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
[[gnu::target("avx512f,avx512vpopcntdq")]] uint64_t CountMembersAvx512(const uint64_t* m,
                                                                       uint64_t words) {
  if (words != kContextBlockWords) return CountMembers(m, words);
  __m512i sum = _mm512_setzero_si512();
  for (uint64_t v = 0; v < kContextBlockWords; v += 8)
    sum = _mm512_add_epi64(sum, _mm512_popcnt_epi64(_mm512_loadu_si512(m + v)));
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(sum));
}

[[gnu::target("avx512f,avx512vpopcntdq")]] uint64_t RankDirectoryAvx512(const uint64_t* m,
                                                                        uint64_t words,
                                                                        uint16_t* before) {
  if (words != kContextBlockWords) return RankDirectory(m, words, before);
  const __m512i zero = _mm512_setzero_si512();
  // Each vector's eight counts scanned on their own (independent), then
  // each vector's carry: the totals of the vectors before it.
  __m512i scan[8];
  uint64_t total[8];
  for (int v = 0; v < 8; ++v) {
    const __m512i c = _mm512_popcnt_epi64(_mm512_loadu_si512(m + 8 * v));
    __m512i s = _mm512_add_epi64(c, _mm512_alignr_epi64(c, zero, 7));  // + the lane before
    s = _mm512_add_epi64(s, _mm512_alignr_epi64(s, zero, 6));          // + the two before those
    s = _mm512_add_epi64(s, _mm512_alignr_epi64(s, zero, 4));          // + the four before
    scan[v] = _mm512_sub_epi64(s, c);                                  // exclusive
    total[v] = static_cast<uint64_t>(_mm_cvtsi128_si64(
        _mm512_castsi512_si128(_mm512_alignr_epi64(zero, s, 7))));  // lane 7: the vector's sum
  }
  uint64_t run = 0;
  for (int v = 0; v < 8; ++v) {
    const __m512i at = _mm512_add_epi64(scan[v], _mm512_set1_epi64(static_cast<long long>(run)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(before + 8 * v), _mm512_cvtepi64_epi16(at));
    run += total[v];
  }
  return run;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#if defined(__AVX2__)
void ClassMasksOfBlock16(const uint8_t* block, ContextField f, uint32_t e0, int classes,
                         uint64_t masks[kMaxClasses][kContextBlockWords]) {
  if (classes <= 2) return ClassMasks16Planes<1>(block, f, e0, classes, masks);
  if (classes <= 4) return ClassMasks16Planes<2>(block, f, e0, classes, masks);
  if (classes <= 8) return ClassMasks16Planes<3>(block, f, e0, classes, masks);
  return ClassMasks16Planes<4>(block, f, e0, classes, masks);
}
#endif

void ClassMasks(const uint8_t* cls, uint64_t n, int classes, uint64_t masks[kMaxClasses][kContextBlockWords]) {
  if (classes <= 2) return ClassMasksPlanes<1>(cls, n, masks);
  if (classes <= 4) return ClassMasksPlanes<2>(cls, n, masks);
  if (classes <= 8) return ClassMasksPlanes<3>(cls, n, masks);
  return ClassMasksPlanes<4>(cls, n, masks);
}

void BuildClassValueDecoder(const uint8_t lengths[kSymbols], ClassValueDecoder* d) {
  int longest = 0;
  for (int s = 0; s < kSymbols; ++s) longest = std::max<int>(longest, lengths[s]);
  d->bits = std::min(longest, ClassValueDecoder::kCapBits);
  format::BuildCanonicalDecoder(lengths, &d->canonical);
  // Table entries for codes that fit: the stream holds a code MSB first, so
  // the table is indexed by the bit-reversed code (as BuildDecoder's).
  std::fill(std::begin(d->table), std::end(d->table), uint16_t{0});
  uint16_t codes[kSymbols] = {};
  CanonicalCodes(lengths, codes);
  for (int s = 0; s < kSymbols; ++s) {
    const int len = lengths[s];
    if (!len || len > d->bits) continue;
    const uint16_t entry = static_cast<uint16_t>((s << 4) | len);
    for (uint32_t i = codes[s]; i < (1u << d->bits); i += 1u << len) d->table[i] = entry;
  }
}

Status ValidateContextStreams(const RecordView& r, int w) {
  ContextTable t;
  TERN_RETURN_IF_ERROR(ParseContextTable(r, &t));
  const uint64_t count = r.h.element_count;
  for (int c = 0; c < t.classes; ++c) {
    const ContextClass& cc = t.cls[c];
    if (cc.changes == 0) continue;
    BitReader pin(cc.positions, cc.position_bytes), vin(cc.values, cc.value_bytes);
    ClassValueDecoder dec;
    BuildClassValueDecoder(cc.lengths, &dec);
    uint64_t next = 0;  // smallest class rank allowed for the next change
    for (uint64_t j = 0; j < cc.changes; ++j) {
      uint64_t gap;
      if (!format::ReadRice(pin, cc.rice_k, count, &gap))
        return TERN_ERROR(kCorrupt, "CONTEXT segment: bad position code in class ", c);
      if (pin.Overrun() || gap >= count - next)
        return TERN_ERROR(kCorrupt, "CONTEXT segment: position out of range in class ", c);
      next += gap + 1;
      uint64_t z;
      if (!DecodeClassValue(vin, dec, w, &z) || vin.Overrun())
        return TERN_ERROR(kCorrupt, "CONTEXT segment: bad value code in class ", c);
    }
    TERN_REQUIRE(pin.FinishedCleanly() && vin.FinishedCleanly(), kCorrupt, "CONTEXT segment: class ", c,
                 " streams not cleanly consumed");
  }
  return Status::Ok();
}

namespace {

// Class ranks of the changes: rank[j] = members of class cls[j] before
// positions[j] in the segment. One pass over the base in blocks.
template <int W>
void RankChanges(const uint64_t* positions, uint64_t n, const uint8_t* tensor, ContextField f, uint32_t e0,
                 int classes, uint64_t first, uint64_t count, uint8_t* klass, uint64_t* rank) {
  alignas(64) uint8_t cls[kContextBlock];
  alignas(64) uint64_t masks[kMaxClasses][kContextBlockWords];
  uint64_t before[kMaxClasses] = {};
  uint64_t j = 0;
  for (uint64_t b0 = 0; b0 < count; b0 += kContextBlock) {
    const uint64_t len = std::min(kContextBlock, count - b0);
    const uint64_t words = (len + 63) / 64;
    BaseClassMasks<W>(tensor, first + b0, len, f, e0, classes, cls, masks);
    uint64_t cursor[kMaxClasses] = {};  // words of the block already counted into before[]
    for (; j < n && positions[j] < b0 + len; ++j) {
      const uint64_t q = positions[j] - b0;
      // The changed element's class from the base (the fused path leaves
      // no class bytes behind).
      const int c = format::ContextClassOf(LoadElement<W>(tensor, first + b0 + q), f, e0, classes);
      const uint64_t word = q / 64;
      for (; cursor[c] < word; ++cursor[c]) before[c] += static_cast<uint64_t>(std::popcount(masks[c][cursor[c]]));
      klass[j] = static_cast<uint8_t>(c);
      rank[j] = before[c] + static_cast<uint64_t>(std::popcount(masks[c][word] & ((uint64_t{1} << (q % 64)) - 1)));
    }
    for (int c = 0; c < classes; ++c)
      for (; cursor[c] < words; ++cursor[c]) before[c] += static_cast<uint64_t>(std::popcount(masks[c][cursor[c]]));
  }
}

// e0 that minimises the estimated size of K classes: the position bound
// sum n_c H(p_c) from the exponent histograms of all elements (sampled) and
// of the changes, plus about 10 bytes of table per class that has changes.
// Prefix sums make each candidate O(K).
uint32_t ChooseE0(const std::vector<double>& all, const std::vector<double>& changed, int classes) {
  constexpr double kClassTableBits = 80;
  const int bins = static_cast<int>(all.size());
  int lo = bins, hi = -1;
  for (int x = 0; x < bins; ++x)
    if (changed[x] > 0) lo = std::min(lo, x), hi = std::max(hi, x);
  if (hi < 0) return 0;
  std::vector<double> all_below(bins + 1, 0.0), changed_below(bins + 1, 0.0);  // sums over x < i
  for (int x = 0; x < bins; ++x) {
    all_below[x + 1] = all_below[x] + all[x];
    changed_below[x + 1] = changed_below[x] + changed[x];
  }
  auto range = [&](const std::vector<double>& below, int from, int to) {  // x in [from, to]
    from = std::clamp(from, 0, bins);
    to = std::clamp(to + 1, 0, bins);
    return to > from ? below[to] - below[from] : 0.0;
  };
  uint32_t best_e0 = static_cast<uint32_t>(hi + 1);
  double best = 1e300;
  for (int e0 = lo; e0 <= std::min(hi + classes, 4095); ++e0) {
    double bits = 0;
    for (int k = 0; k < classes; ++k) {
      // Class k: x == e0 - k; class 0 also takes x > e0, the last x < e0 - k.
      const int from = k == classes - 1 ? 0 : e0 - k, to = k == 0 ? bins - 1 : e0 - k;
      const double n = range(all_below, from, to), c = range(changed_below, from, to);
      if (c > 0) bits += kClassTableBits + (n > c ? n * Entropy2(c / n) : 0.0);
    }
    if (bits < best) best = bits, best_e0 = static_cast<uint32_t>(e0);
  }
  return best_e0;
}

}  // namespace

bool EncodeContext(const uint64_t* positions, const uint64_t* deltas, uint64_t n, int w, const uint8_t* tensor,
                   ContextField f, int max_classes, uint64_t first, uint64_t count, uint64_t limit_bytes,
                   ContextPayload* out) {
  const int bins = static_cast<int>(f.mask) + 1;
  // K: as many classes as the field has values, up to 16, but about 32
  // changes per class at least, so that small records do not pay 16 tables.
  // (Choosing K per record by the position estimate instead made datagen
  // patches 1% larger: the values, which it leaves out, gain from classes.)
  int classes = std::min({max_classes, kMaxClasses, bins});
  while (classes > 2 && n < 32 * static_cast<uint64_t>(classes)) classes /= 2;
  // The smallest CONTEXT payload: K, e0, a count per class and one class's
  // fields, table and streams.
  if (classes < 2 || n == 0 || limit_bytes <= 3 + static_cast<uint64_t>(classes) + 6) return false;
  // Exponent histograms: every change, and every 16th element of the segment.
  std::vector<double> all(bins, 0.0), changed(bins, 0.0);
  constexpr uint64_t kStride = 16;
  DispatchWidth(w, [&]<int W>() {
    for (uint64_t i = 0; i < count; i += kStride)
      all[(LoadElement<W>(tensor, first + i) >> f.shift) & f.mask] += double(kStride);
    for (uint64_t j = 0; j < n; ++j) changed[(LoadElement<W>(tensor, first + positions[j]) >> f.shift) & f.mask] += 1;
  });
  const uint32_t e0 = ChooseE0(all, changed, classes);

  thread_local std::vector<uint8_t> klass;
  thread_local std::vector<uint64_t> rank, order;
  klass.resize(n);
  rank.resize(n);
  DispatchWidth(w, [&]<int W>() {
    RankChanges<W>(positions, n, tensor, f, e0, classes, first, count, klass.data(), rank.data());
  });
  // Changes grouped by class, in position order within a class.
  uint64_t start[kMaxClasses + 1] = {};
  for (uint64_t j = 0; j < n; ++j) start[klass[j] + 1]++;
  for (int c = 0; c < classes; ++c) start[c + 1] += start[c];
  order.resize(n);
  {
    uint64_t fill[kMaxClasses];
    std::copy(start, start + kMaxClasses, fill);
    for (uint64_t j = 0; j < n; ++j) order[fill[klass[j]]++] = j;
  }
  thread_local std::vector<uint64_t> ranks;
  ranks.resize(n);
  for (uint64_t j = 0; j < n; ++j) ranks[j] = rank[order[j]];

  struct Plan {
    int k = 0;
    uint64_t pos_bits = 0, val_bits = 0;
    uint8_t lengths[kSymbols] = {};
  };
  Plan plan[kMaxClasses];
  uint64_t total = 3;  // K, e0
  for (int c = 0; c < classes; ++c) {
    const uint64_t m = start[c + 1] - start[c];
    total += format::VarintBytes(m);
    if (m == 0) continue;
    Plan& p = plan[c];
    const uint64_t* r = ranks.data() + start[c];
    p.k = format::BestRiceK(r, m, /*span=*/r[m - 1] + 1, /*k_max=*/24, &p.pos_bits);
    uint64_t freq[kSymbols] = {}, extra = 0;
    for (uint64_t j = start[c]; j < start[c + 1]; ++j) {
      int eb;
      uint64_t ex;
      freq[ValueSymbol(ZigZag(deltas[order[j]], w), &eb, &ex)]++;
      extra += static_cast<uint64_t>(eb);
    }
    BuildLengths(freq, p.lengths);
    p.val_bits = CodeBits(freq, p.lengths) + extra;
    const uint64_t pb = (p.pos_bits + 7) / 8, vb = (p.val_bits + 7) / 8;
    total +=
        1 + format::VarintBytes(pb) + format::VarintBytes(vb) + TableBytes(p.lengths) + pb + vb;
  }
  if (total >= limit_bytes) return false;

  std::vector<uint8_t>& o = out->bytes;
  o.clear();
  VectorSink sink{&o};
  o.push_back(static_cast<uint8_t>(classes));
  o.push_back(static_cast<uint8_t>(e0));
  o.push_back(static_cast<uint8_t>(e0 >> 8));
  for (int c = 0; c < classes; ++c) {
    const uint64_t m = start[c + 1] - start[c];
    format::PutVarint(m, &sink);
    if (m == 0) continue;
    o.push_back(static_cast<uint8_t>(plan[c].k));
    format::PutVarint((plan[c].pos_bits + 7) / 8, &sink);
    format::PutVarint((plan[c].val_bits + 7) / 8, &sink);
    format::WriteTable(plan[c].lengths, &sink);
  }
  out->table_bytes = static_cast<uint32_t>(o.size());
  for (int c = 0; c < classes; ++c) {
    const uint64_t m = start[c + 1] - start[c];
    if (m == 0) continue;
    const int k = plan[c].k;
    BitWriter bw(&o);
    uint64_t next = 0;
    for (uint64_t j = start[c]; j < start[c + 1]; ++j) {
      format::PutRice(bw, ranks[j] - next, k);
      next = ranks[j] + 1;
    }
    bw.Finish();
  }
  out->position_bytes = static_cast<uint32_t>(o.size() - out->table_bytes);
  for (int c = 0; c < classes; ++c) {
    if (start[c + 1] == start[c]) continue;
    uint16_t codes[kSymbols] = {};
    CanonicalCodes(plan[c].lengths, codes);
    BitWriter bw(&o);
    for (uint64_t j = start[c]; j < start[c + 1]; ++j)
      format::PutValue(bw, codes, plan[c].lengths, deltas[order[j]], w);
    bw.Finish();
  }
  out->value_bytes = static_cast<uint32_t>(o.size() - out->table_bytes - out->position_bytes);
  return true;
}

}  // namespace tern::patch
