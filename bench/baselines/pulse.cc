#include "bench/baselines/pulse.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace tern::bench {

namespace {

constexpr uint32_t kMagic = 0x534C5550;  // "PULS"
constexpr uint16_t kMaxNameBytes = 4096;

void PutUint(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int b = 0; b < bytes; ++b) out.push_back(uint8_t(v >> (8 * b)));
}

uint64_t LoadUint(const uint8_t* p, int bytes) {
  switch (bytes) {
    case 1:
      return p[0];
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

// Flat indices of the elements whose bytes differ, ascending.
std::vector<uint64_t> ChangedIndices(const uint8_t* a, const uint8_t* b, uint64_t elements,
                                     int element_bytes) {
  std::vector<uint64_t> out;
  const uint64_t bytes = elements * uint64_t(element_bytes);
  uint64_t off = 0;
  // Skip equal 32-byte blocks (the common case) before looking at elements.
  for (; off + 32 <= bytes; off += 32) {
    if (std::memcmp(a + off, b + off, 32) == 0) continue;
    for (uint64_t e = off; e < off + 32; e += uint64_t(element_bytes))
      if (std::memcmp(a + e, b + e, size_t(element_bytes)) != 0)
        out.push_back(e / uint64_t(element_bytes));
  }
  for (; off < bytes; off += uint64_t(element_bytes))
    if (std::memcmp(a + off, b + off, size_t(element_bytes)) != 0)
      out.push_back(off / uint64_t(element_bytes));
  return out;
}

uint64_t RowLength(const TensorDesc& desc) {
  // grail: 1-D tensors are one column wide; otherwise a row is the product of
  // the trailing dimensions.
  if (desc.shape.size() <= 1) return 1;
  uint64_t cols = 1;
  for (size_t d = 1; d < desc.shape.size(); ++d) cols *= desc.shape[d];
  return std::max<uint64_t>(cols, 1);
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  uint64_t remaining() const { return in_.size() - pos_; }
  bool Read(uint64_t& v, int bytes) {
    if (remaining() < uint64_t(bytes)) return false;
    v = LoadUint(in_.data() + pos_, bytes);
    pos_ += uint64_t(bytes);
    return true;
  }
  const uint8_t* Take(uint64_t bytes) {
    if (remaining() < bytes) return nullptr;
    const uint8_t* p = in_.data() + pos_;
    pos_ += bytes;
    return p;
  }

 private:
  std::span<const uint8_t> in_;
  uint64_t pos_ = 0;
};

struct Record {
  uint8_t* data = nullptr;
  const TensorDesc* desc = nullptr;
  int element_bytes = 0;
  PulseIndexLayout layout = PulseIndexLayout::kFlatGaps;
  int w1 = 0, w2 = 0;
  uint64_t elements = 0, changed = 0, cols = 0;
  const uint8_t* s1 = nullptr;
  const uint8_t* s2 = nullptr;
  const uint8_t* values = nullptr;
};

// Calls fn(j, position) for each change in order; returns false (without
// calling fn for it) at the first position that is out of range or not
// strictly increasing.
template <class Fn>
bool ForEachPosition(const Record& r, Fn&& fn) {
  uint64_t pos = 0;
  if (r.layout == PulseIndexLayout::kFlatGaps) {
    for (uint64_t j = 0; j < r.changed; ++j) {
      const uint64_t g = LoadUint(r.s1 + j * uint64_t(r.w1), r.w1);
      if (j == 0) {
        pos = g;
      } else {
        if (g == 0 || g >= r.elements - pos) return false;
        pos += g;
      }
      if (pos >= r.elements) return false;
      fn(j, pos);
    }
    return true;
  }
  const uint64_t rows = (r.elements + r.cols - 1) / r.cols;
  uint64_t row = 0, col = 0;
  for (uint64_t j = 0; j < r.changed; ++j) {
    const uint64_t rd = LoadUint(r.s1 + j * uint64_t(r.w1), r.w1);
    const uint64_t cd = LoadUint(r.s2 + j * uint64_t(r.w2), r.w2);
    if (rd >= rows - row) return false;
    row += rd;
    if (j == 0 || rd != 0) {
      col = cd;
    } else {
      if (cd == 0 || cd >= r.cols - col) return false;
      col += cd;
    }
    if (col >= r.cols) return false;
    pos = row * r.cols + col;
    if (pos >= r.elements) return false;
    fn(j, pos);
  }
  return true;
}

}  // namespace

int PulseIndexWidthBytes(uint64_t max_value, int min_bytes) {
  int w = 8;
  if (max_value <= 0xFF) w = 1;
  else if (max_value <= 0xFFFF) w = 2;
  else if (max_value <= 0xFFFFFFFFull) w = 4;
  return std::max(w, min_bytes);
}

Result<std::vector<uint8_t>> PulseEncode(const ServeView& old_view, const ServeView& new_view,
                                         const PulseOptions& options) {
  TERN_REQUIRE(old_view.tensors.size() == new_view.tensors.size(), kMismatch,
               "pulse: views hold ", old_view.tensors.size(), " and ", new_view.tensors.size(),
               " tensors");
  std::vector<uint8_t> raw;
  PutUint(raw, kMagic, 4);
  const size_t count_at = raw.size();
  PutUint(raw, 0, 4);
  uint32_t records = 0;
  for (size_t t = 0; t < old_view.tensors.size(); ++t) {
    const TensorDesc& desc = *old_view.tensors[t].desc;
    TERN_REQUIRE(desc.SameLayout(*new_view.tensors[t].desc), kMismatch, "pulse: tensor '",
                 desc.name, "' differs in name, dtype or shape");
    const int bits = ElementBits(desc.dtype);
    TERN_REQUIRE(bits % 8 == 0, kUnsupported, "pulse: tensor '", desc.name, "' has ", bits,
                 "-bit elements; PULSE stores whole bytes");
    TERN_REQUIRE(desc.name.size() <= kMaxNameBytes, kInvalidArgument, "pulse: tensor name too long");
    const int eb = bits / 8;
    const uint64_t n = desc.elements();
    const std::vector<uint64_t> idx =
        ChangedIndices(old_view.tensors[t].data, new_view.tensors[t].data, n, eb);
    if (idx.empty()) continue;  // like grail: unchanged tensors are not sent
    ++records;

    std::vector<uint64_t> s1(idx.size()), s2;
    int w1 = 0, w2 = 0;
    uint64_t cols = 0;
    if (options.layout == PulseIndexLayout::kFlatGaps) {
      uint64_t max_gap = 0;
      for (size_t j = 0; j < idx.size(); ++j) {
        s1[j] = j ? idx[j] - idx[j - 1] : idx[0];
        max_gap = std::max(max_gap, s1[j]);
      }
      w1 = PulseIndexWidthBytes(max_gap, 1);
    } else {
      cols = RowLength(desc);
      s2.resize(idx.size());
      uint64_t max_rd = 0, max_cd = 0, prev_row = 0, prev_col = 0;
      for (size_t j = 0; j < idx.size(); ++j) {
        const uint64_t row = idx[j] / cols, col = idx[j] % cols;
        s1[j] = row - prev_row;
        s2[j] = (j == 0 || row != prev_row) ? col : col - prev_col;
        max_rd = std::max(max_rd, s1[j]);
        max_cd = std::max(max_cd, s2[j]);
        prev_row = row;
        prev_col = col;
      }
      w1 = PulseIndexWidthBytes(max_rd, 1);
      w2 = PulseIndexWidthBytes(max_cd, 2);
    }

    PutUint(raw, desc.name.size(), 2);
    raw.insert(raw.end(), desc.name.begin(), desc.name.end());
    PutUint(raw, uint64_t(eb), 1);
    PutUint(raw, uint64_t(options.layout), 1);
    PutUint(raw, uint64_t(w1), 1);
    PutUint(raw, uint64_t(w2), 1);
    PutUint(raw, n, 8);
    PutUint(raw, idx.size(), 8);
    PutUint(raw, cols, 8);
    raw.reserve(raw.size() + idx.size() * uint64_t(w1 + w2 + eb));
    for (uint64_t v : s1) PutUint(raw, v, w1);
    for (uint64_t v : s2) PutUint(raw, v, w2);
    const uint8_t* nd = new_view.tensors[t].data;
    for (uint64_t i : idx) raw.insert(raw.end(), nd + i * uint64_t(eb), nd + (i + 1) * uint64_t(eb));
  }
  for (int b = 0; b < 4; ++b) raw[count_at + size_t(b)] = uint8_t(records >> (8 * b));

  std::vector<uint8_t> out(ZSTD_compressBound(raw.size()));
  const size_t got = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), options.zstd_level);
  TERN_REQUIRE(!ZSTD_isError(got), kInternal, "pulse: zstd: ", ZSTD_getErrorName(got));
  out.resize(got);
  return out;
}

Status PulseApply(std::span<const uint8_t> patch, MutableServeView& view) {
  // The decompressed size is bounded by what a patch of this view can hold.
  uint64_t limit = 8;
  for (const auto& t : view.tensors)
    limit += 2 + t.desc->name.size() + 28 + t.desc->elements() * (16 + 8);
  const unsigned long long content = ZSTD_getFrameContentSize(patch.data(), patch.size());
  TERN_REQUIRE(content != ZSTD_CONTENTSIZE_ERROR && content != ZSTD_CONTENTSIZE_UNKNOWN, kCorrupt,
               "pulse: not a zstd frame with a known size");
  TERN_REQUIRE(content <= limit, kCorrupt, "pulse: frame claims ", content,
               " bytes, more than a patch of this view can hold (", limit, ")");
  std::vector<uint8_t> raw(content);
  const size_t got = ZSTD_decompress(raw.data(), raw.size(), patch.data(), patch.size());
  TERN_REQUIRE(!ZSTD_isError(got), kCorrupt, "pulse: zstd: ", ZSTD_getErrorName(got));
  TERN_REQUIRE(got == content, kCorrupt, "pulse: frame decoded to ", got, " bytes, header said ",
               content);

  Reader in(raw);
  uint64_t magic = 0, count = 0;
  TERN_REQUIRE(in.Read(magic, 4) && magic == kMagic, kCorrupt, "pulse: bad magic");
  TERN_REQUIRE(in.Read(count, 4) && count <= view.tensors.size(), kCorrupt, "pulse: ", count,
               " tensor records for a view of ", view.tensors.size());
  std::vector<Record> records;
  size_t next_tensor = 0;  // records come in view order, each tensor at most once
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t name_len = 0;
    TERN_REQUIRE(in.Read(name_len, 2) && name_len <= kMaxNameBytes, kCorrupt,
                 "pulse: record ", k, ": bad name length");
    const uint8_t* name_p = in.Take(name_len);
    TERN_REQUIRE(name_p, kCorrupt, "pulse: record ", k, ": truncated name");
    const std::string name(reinterpret_cast<const char*>(name_p), name_len);
    while (next_tensor < view.tensors.size() && view.tensors[next_tensor].desc->name != name)
      ++next_tensor;
    TERN_REQUIRE(next_tensor < view.tensors.size(), kMismatch, "pulse: tensor '", name,
                 "' is not in the view (or out of order)");
    Record r;
    r.desc = view.tensors[next_tensor].desc;
    r.data = view.tensors[next_tensor].data;
    ++next_tensor;
    uint64_t eb = 0, layout = 0, w1 = 0, w2 = 0;
    TERN_REQUIRE(in.Read(eb, 1) && in.Read(layout, 1) && in.Read(w1, 1) && in.Read(w2, 1) &&
                     in.Read(r.elements, 8) && in.Read(r.changed, 8) && in.Read(r.cols, 8),
                 kCorrupt, "pulse: tensor '", name, "': truncated record header");
    const int bits = ElementBits(r.desc->dtype);
    TERN_REQUIRE(bits % 8 == 0 && eb == uint64_t(bits / 8), kMismatch, "pulse: tensor '", name,
                 "': ", eb, "-byte values for a ", bits, "-bit dtype");
    TERN_REQUIRE(r.elements == r.desc->elements(), kMismatch, "pulse: tensor '", name, "': ",
                 r.elements, " elements, view has ", r.desc->elements());
    TERN_REQUIRE(layout <= 1, kCorrupt, "pulse: tensor '", name, "': unknown layout ", layout);
    r.layout = PulseIndexLayout(layout);
    auto width_ok = [](uint64_t w) { return w == 1 || w == 2 || w == 4 || w == 8; };
    const bool flat = r.layout == PulseIndexLayout::kFlatGaps;
    TERN_REQUIRE(width_ok(w1) && (flat ? w2 == 0 && r.cols == 0
                                       : width_ok(w2) && r.cols >= 1 && r.cols <= r.elements),
                 kCorrupt, "pulse: tensor '", name, "': bad index widths or row length");
    r.element_bytes = int(eb);
    r.w1 = int(w1);
    r.w2 = int(w2);
    const uint64_t per_change = w1 + w2 + eb;
    TERN_REQUIRE(r.changed >= 1 && r.changed <= r.elements &&
                     r.changed <= in.remaining() / per_change,
                 kCorrupt, "pulse: tensor '", name, "': ", r.changed,
                 " changes do not fit the tensor or the patch");
    r.s1 = in.Take(r.changed * w1);
    r.s2 = in.Take(r.changed * w2);
    r.values = in.Take(r.changed * eb);
    TERN_REQUIRE(ForEachPosition(r, [](uint64_t, uint64_t) {}), kCorrupt, "pulse: tensor '", name,
                 "': positions out of range or not increasing");
    records.push_back(r);
  }
  TERN_REQUIRE(in.remaining() == 0, kCorrupt, "pulse: ", in.remaining(), " trailing bytes");

  for (const Record& r : records) {
    const uint64_t eb = uint64_t(r.element_bytes);
    const bool ok = ForEachPosition(r, [&](uint64_t j, uint64_t pos) {
      std::memcpy(r.data + pos * eb, r.values + j * eb, eb);
    });
    TERN_ASSERT(ok, "positions validated above");
  }
  return Status::Ok();
}

}  // namespace tern::bench
