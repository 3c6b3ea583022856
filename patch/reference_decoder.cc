#include "patch/reference_decoder.h"

#include <algorithm>
#include <functional>

#include "patch/container.h"
#include "patch/context_codec.h"
#include "patch/element_access.h"

namespace tern::patch {
namespace {

// Bit i of a stream is bit (i mod 8) of byte i / 8.
struct Bits {
  const uint8_t* data;
  uint64_t bytes;
  uint64_t pos = 0;
  bool ok = true;
  int Bit() {
    if (pos >= bytes * 8) {
      ok = false;
      return 0;
    }
    const int b = (data[pos / 8] >> (pos % 8)) & 1;
    ++pos;
    return b;
  }
  uint64_t Number(int n) {  // n bits, first bit is the least significant
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(Bit()) << i;
    return v;
  }
  bool Clean() const {
    if (!ok || (pos + 7) / 8 != bytes) return false;
    for (uint64_t i = pos; i < bytes * 8; ++i)
      if ((data[i / 8] >> (i % 8)) & 1) return false;
    return true;
  }
};

struct Code {
  int length;
  uint32_t code;  // most significant bit is sent first
  int symbol;
};

// Canonical code: symbols sorted by (length, symbol) get consecutive codes,
// shifting left whenever the length grows.
std::vector<Code> CanonicalCode(const uint8_t lengths[kSymbols]) {
  std::vector<Code> codes;
  for (int s = 0; s < kSymbols; ++s)
    if (lengths[s]) codes.push_back({lengths[s], 0, s});
  std::sort(codes.begin(), codes.end(), [](const Code& a, const Code& b) {
    return a.length != b.length ? a.length < b.length : a.symbol < b.symbol;
  });
  uint32_t code = 0;
  int length = codes.empty() ? 0 : codes[0].length;
  for (size_t i = 0; i < codes.size(); ++i) {
    if (i > 0) ++code;
    code <<= (codes[i].length - length);
    length = codes[i].length;
    codes[i].code = code;
  }
  return codes;
}

bool ReadValue(Bits& in, const std::vector<Code>& codes, int w, uint64_t* z) {
  uint32_t code = 0;
  for (int length = 1; length <= kMaxCodeBits; ++length) {
    code = (code << 1) | static_cast<uint32_t>(in.Bit());
    for (const Code& c : codes) {
      if (c.length != length || c.code != code) continue;
      if (c.symbol < kLiteralSymbols) {
        *z = static_cast<uint64_t>(c.symbol);
        return in.ok;
      }
      const int bit_length = c.symbol - kLiteralSymbols + 5;
      if (bit_length > w) return false;
      *z = (uint64_t{1} << (bit_length - 1)) | in.Number(bit_length - 1);
      return in.ok;
    }
  }
  return false;
}

uint64_t Unzigzag(uint64_t z, int w) {
  const uint64_t magnitude = z / 2;
  const uint64_t value = (z % 2) ? ~magnitude : magnitude;
  return w == 64 ? value : value % (uint64_t{1} << w);
}

uint64_t RiceGap(Bits& in, int k, uint64_t limit, bool* ok) {
  uint64_t q = 0;
  while (in.Bit() == 0) {
    if (!in.ok || q >= limit) {
      *ok = false;
      return 0;
    }
    ++q;
  }
  const uint64_t gap = (q << k) + in.Number(k);
  *ok = in.ok;
  return gap;
}

// CONTEXT (spec §6.4): class c's changes are Rice gaps between ranks among
// the segment's class-c elements, in element order; the class of an element
// is clamp(e0 - exponent field of its base value, 0, K - 1).
Status DecodeContextRecord(const RecordView& r, const ManifestTensor& mt, const uint8_t* base,
                           const std::function<void(uint64_t, uint64_t)>& emit) {
  const RecordHeader& h = r.h;
  const int w = mt.width_bits;
  ContextTable t;
  TERN_RETURN_IF_ERROR(ParseContextTable(r, &t));
  std::vector<std::vector<uint64_t>> members(t.classes);
  if (base != nullptr) {
    for (uint64_t i = 0; i < h.element_count; ++i) {
      uint64_t v = 0;
      DispatchWidth(w, [&]<int W>() { v = LoadElement<W>(base, h.first_element + i); });
      const int64_t x = static_cast<int64_t>((v >> mt.context.shift) & mt.context.mask);
      const int64_t c = std::clamp<int64_t>(int64_t{t.e0} - x, 0, t.classes - 1);
      members[c].push_back(i);
    }
  }
  for (int c = 0; c < t.classes; ++c) {
    const ContextClass& cc = t.cls[c];
    if (cc.changes == 0) continue;
    const std::vector<Code> codes = CanonicalCode(cc.lengths);
    Bits ps{cc.positions, cc.position_bytes}, vs{cc.values, cc.value_bytes};
    uint64_t rank = 0;
    for (uint64_t j = 0; j < cc.changes; ++j) {
      bool ok;
      const uint64_t gap = RiceGap(ps, cc.rice_k, h.element_count, &ok);
      if (j > 0) rank += 1;
      TERN_REQUIRE(ok && gap < h.element_count && rank + gap < h.element_count, kCorrupt,
                   "reference: CONTEXT position out of range");
      rank += gap;
      uint64_t z;
      TERN_REQUIRE(ReadValue(vs, codes, w, &z) && z != 0, kCorrupt, "reference: bad CONTEXT value");
      if (base == nullptr) continue;
      TERN_REQUIRE(rank < members[c].size(), kCorrupt, "reference: CONTEXT rank past its class");
      emit(members[c][rank], Unzigzag(z, w));
    }
    TERN_REQUIRE(ps.Clean() && vs.Clean(), kCorrupt, "reference: CONTEXT streams not cleanly consumed");
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<RefChange>> ReferenceDecode(std::span<const uint8_t> patch, const ServeView* base) {
  TERN_ASSIGN_OR_RETURN(ParsedPatch p, ParsePatch(patch));
  if (base != nullptr) {
    TERN_REQUIRE(base->tensors.size() == p.tensors.size(), kMismatch, "reference: base has another layout");
    for (size_t t = 0; t < p.tensors.size(); ++t)
      TERN_REQUIRE(base->tensors[t].desc->SameLayout(p.tensors[t].desc), kMismatch,
                   "reference: base has another layout");
  }
  std::vector<RefChange> out;
  for (const RecordView& r : p.records) {
    const RecordHeader& h = r.h;
    // A nibble-coded tensor's records are 4-bit elements (§3.2): so are its changes.
    const int w = p.tensors[h.tensor_index].code_bits;
    auto emit = [&](uint64_t pos, uint64_t delta) {
      out.push_back({h.tensor_index, h.first_element + pos, delta, w});
    };
    uint64_t changed = 0;
    if (h.encoding == kContext) {
      TERN_RETURN_IF_ERROR(DecodeContextRecord(r, p.tensors[h.tensor_index],
                                               base ? base->tensors[h.tensor_index].data : nullptr, emit));
      continue;
    }
    if (h.encoding == kRaw) {
      Bits v{r.values, h.value_bytes};
      for (uint64_t i = 0; i < h.element_count; ++i) {
        const uint64_t d = v.Number(w);
        if (d) emit(i, d), ++changed;
      }
      TERN_REQUIRE(v.Clean() && changed == h.changed_count, kCorrupt, "reference: bad RAW segment");
      continue;
    }
    uint8_t lengths[kSymbols];
    TERN_RETURN_IF_ERROR(ParseCodeLengths(r.table, h.table_bytes, lengths));
    const std::vector<Code> codes = CanonicalCode(lengths);
    Bits v{r.values, h.value_bytes};
    if (h.encoding == kDense) {
      for (uint64_t i = 0; i < h.element_count; ++i) {
        uint64_t z;
        TERN_REQUIRE(ReadValue(v, codes, w, &z), kCorrupt, "reference: bad DENSE value");
        if (z) emit(i, Unzigzag(z, w)), ++changed;
      }
      TERN_REQUIRE(v.Clean() && changed == h.changed_count, kCorrupt, "reference: bad DENSE segment");
      continue;
    }
    Bits ps{r.positions, h.position_bytes};
    uint64_t pos = 0;
    for (uint64_t j = 0; j < h.changed_count; ++j) {
      uint64_t q = 0;
      while (ps.Bit() == 0) {
        TERN_REQUIRE(ps.ok && q < h.element_count, kCorrupt, "reference: runaway unary code");
        ++q;
      }
      TERN_REQUIRE(ps.ok && (h.rice_k >= 64 || q < (h.element_count >> h.rice_k) + 1), kCorrupt,
                   "reference: position out of range");
      const uint64_t gap = (q << h.rice_k) + ps.Number(h.rice_k);
      if (j > 0) pos += 1;
      TERN_REQUIRE(ps.ok && gap < h.element_count && pos + gap < h.element_count, kCorrupt,
                   "reference: position out of range");
      pos += gap;
      uint64_t z;
      TERN_REQUIRE(ReadValue(v, codes, w, &z) && z != 0, kCorrupt, "reference: bad SPARSE value");
      emit(pos, Unzigzag(z, w));
    }
    TERN_REQUIRE(ps.Clean() && v.Clean(), kCorrupt, "reference: SPARSE streams not cleanly consumed");
  }
  return out;
}

}  // namespace tern::patch
