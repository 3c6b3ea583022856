#include "bench/baselines/entropy_bound.h"

#include <cmath>
#include <cstring>

namespace tern::bench {

uint64_t ZigzagDelta(uint64_t old_bits, uint64_t new_bits, int bits) {
  const uint64_t mask = bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  const uint64_t d = (new_bits - old_bits) & mask;
  const uint64_t sign = (d >> (bits - 1)) & 1;
  // Zigzag in w bits: (d << 1) ^ (sign ? all-ones : 0), masked to w bits.
  return ((d << 1) ^ (sign ? mask : 0)) & mask;
}

double BinaryEntropyBits(double p) {
  if (p <= 0.0 || p >= 1.0) return 0.0;
  return -p * std::log2(p) - (1.0 - p) * std::log2(1.0 - p);
}

namespace {
constexpr uint64_t kSmall = uint64_t{1} << 16;

template <class T>
void CountChanges(const uint8_t* old_p, const uint8_t* new_p, uint64_t n, int bits,
                  std::vector<uint64_t>& small, std::unordered_map<uint64_t, uint64_t>& large,
                  uint64_t& changed) {
  constexpr uint64_t kPerWord = 8 / sizeof(T) ? 8 / sizeof(T) : 1;
  uint64_t i = 0;
  for (; i < n; ++i) {
    // Skip whole 8-byte words that are equal: the common case at low density.
    if (sizeof(T) < 8 && i % kPerWord == 0 && i + kPerWord <= n) {
      uint64_t a, b;
      std::memcpy(&a, old_p + i * sizeof(T), 8);
      std::memcpy(&b, new_p + i * sizeof(T), 8);
      if (a == b) {
        i += kPerWord - 1;
        continue;
      }
    }
    T a, b;
    std::memcpy(&a, old_p + i * sizeof(T), sizeof(T));
    std::memcpy(&b, new_p + i * sizeof(T), sizeof(T));
    if (a == b) continue;
    ++changed;
    const uint64_t z = ZigzagDelta(a, b, bits);
    if (z < kSmall)
      ++small[z];
    else
      ++large[z];
  }
}
}  // namespace

Status EntropyCounter::Add(std::span<const uint8_t> old_bytes, std::span<const uint8_t> new_bytes,
                           int bits) {
  TERN_REQUIRE(bits == 8 || bits == 16 || bits == 32 || bits == 64, kUnsupported,
               "entropy bound: element width ", bits, " bits is not byte-aligned");
  TERN_REQUIRE(old_bytes.size() == new_bytes.size(), kMismatch, "entropy bound: old has ",
               old_bytes.size(), " bytes, new ", new_bytes.size());
  const uint64_t width = uint64_t(bits) / 8;
  TERN_REQUIRE(old_bytes.size() % width == 0, kInvalidArgument, "entropy bound: ",
               old_bytes.size(), " bytes is not a whole number of ", bits, "-bit elements");
  if (small_.empty()) small_.assign(kSmall, 0);
  const uint64_t n = old_bytes.size() / width;
  elements_ += n;
  switch (bits) {
    case 8:
      CountChanges<uint8_t>(old_bytes.data(), new_bytes.data(), n, bits, small_, large_, changed_);
      break;
    case 16:
      CountChanges<uint16_t>(old_bytes.data(), new_bytes.data(), n, bits, small_, large_, changed_);
      break;
    case 32:
      CountChanges<uint32_t>(old_bytes.data(), new_bytes.data(), n, bits, small_, large_, changed_);
      break;
    default:
      CountChanges<uint64_t>(old_bytes.data(), new_bytes.data(), n, bits, small_, large_, changed_);
  }
  return Status::Ok();
}

Status EntropyCounter::AddViews(const ServeView& old_view, const ServeView& new_view) {
  TERN_REQUIRE(old_view.tensors.size() == new_view.tensors.size(), kMismatch,
               "entropy bound: views hold ", old_view.tensors.size(), " and ",
               new_view.tensors.size(), " tensors");
  for (size_t t = 0; t < old_view.tensors.size(); ++t) {
    const TensorDesc& a = *old_view.tensors[t].desc;
    const TensorDesc& b = *new_view.tensors[t].desc;
    TERN_REQUIRE(a.SameLayout(b), kMismatch, "entropy bound: tensor '", a.name,
                 "' differs in name, dtype or shape");
    const uint64_t bytes = a.bytes();
    TERN_RETURN_IF_ERROR(Add({old_view.tensors[t].data, bytes}, {new_view.tensors[t].data, bytes},
                             ElementBits(a.dtype))
                             .WithContext(a.name));
  }
  return Status::Ok();
}

void EntropyCounter::Merge(const EntropyCounter& other) {
  elements_ += other.elements_;
  changed_ += other.changed_;
  if (!other.small_.empty()) {
    if (small_.empty()) small_.assign(kSmall, 0);
    for (uint64_t i = 0; i < kSmall; ++i) small_[i] += other.small_[i];
  }
  for (const auto& [z, c] : other.large_) large_[z] += c;
}

EntropyBound EntropyCounter::Bound() const {
  EntropyBound b;
  b.elements = elements_;
  b.changed = changed_;
  if (elements_ == 0) return b;
  b.position_bits = double(elements_) * BinaryEntropyBits(double(changed_) / double(elements_));
  // c * H(D) = sum over symbols of count * log2(c / count).
  const double c = double(changed_);
  double bits = 0;
  auto add = [&](uint64_t count) {
    if (count) bits += double(count) * std::log2(c / double(count));
  };
  for (uint64_t count : small_) add(count);
  for (const auto& [z, count] : large_) add(count);
  b.value_bits = bits;
  return b;
}

namespace {
// Exponent field of an element's bits, or 0 for dtypes without one.
inline uint64_t ExponentOf(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::kBF16:
      return (bits >> 7) & 0xFF;
    case DType::kF16:
      return (bits >> 10) & 0x1F;
    case DType::kF32:
      return (bits >> 23) & 0xFF;
    default:
      return 0;
  }
}
}  // namespace

Status ExponentContextCounter::Add(std::span<const uint8_t> old_bytes,
                                   std::span<const uint8_t> new_bytes, DType dtype) {
  const int bits = ElementBits(dtype);
  TERN_REQUIRE(bits == 8 || bits == 16 || bits == 32 || bits == 64, kUnsupported,
               "entropy bound: element width ", bits, " bits is not byte-aligned");
  TERN_REQUIRE(old_bytes.size() == new_bytes.size(), kMismatch, "entropy bound: old has ",
               old_bytes.size(), " bytes, new ", new_bytes.size());
  const uint64_t width = uint64_t(bits) / 8;
  TERN_REQUIRE(old_bytes.size() % width == 0, kInvalidArgument, "entropy bound: ",
               old_bytes.size(), " bytes is not a whole number of ", bits, "-bit elements");
  const uint64_t n = old_bytes.size() / width;
  const uint64_t key_base = uint64_t(dtype) << 16;
  // Per-class element counts first, in a flat table (the exponent has at most
  // 8 bits), then changes.
  std::vector<uint64_t> counts(256, 0);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t a = 0, b = 0;
    std::memcpy(&a, old_bytes.data() + i * width, width);
    std::memcpy(&b, new_bytes.data() + i * width, width);
    const uint64_t e = ExponentOf(dtype, a);
    ++counts[e];
    if (a == b) continue;
    Class& c = classes_[key_base | e];
    ++c.changed;
    ++c.values[ZigzagDelta(a, b, bits)];
  }
  for (uint64_t e = 0; e < 256; ++e)
    if (counts[e]) classes_[key_base | e].elements += counts[e];
  return Status::Ok();
}

Status ExponentContextCounter::AddViews(const ServeView& old_view, const ServeView& new_view) {
  TERN_REQUIRE(old_view.tensors.size() == new_view.tensors.size(), kMismatch,
               "entropy bound: views hold ", old_view.tensors.size(), " and ",
               new_view.tensors.size(), " tensors");
  for (size_t t = 0; t < old_view.tensors.size(); ++t) {
    const TensorDesc& a = *old_view.tensors[t].desc;
    TERN_REQUIRE(a.SameLayout(*new_view.tensors[t].desc), kMismatch, "entropy bound: tensor '",
                 a.name, "' differs in name, dtype or shape");
    TERN_RETURN_IF_ERROR(
        Add({old_view.tensors[t].data, a.bytes()}, {new_view.tensors[t].data, a.bytes()}, a.dtype)
            .WithContext(a.name));
  }
  return Status::Ok();
}

EntropyBound ExponentContextCounter::Bound() const {
  EntropyBound b;
  for (const auto& [key, c] : classes_) {
    b.elements += c.elements;
    b.changed += c.changed;
    if (c.elements) b.position_bits += double(c.elements) * BinaryEntropyBits(double(c.changed) / double(c.elements));
    for (const auto& [z, count] : c.values) b.value_bits += double(count) * std::log2(double(c.changed) / double(count));
  }
  return b;
}

}  // namespace tern::bench
