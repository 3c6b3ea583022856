// The information content of a change between two serve views, the yardstick
// the patch codec is measured against (docs/benchmarks.md, "Patch codec").
//
// For n elements of which c changed (p = c/n) the bound is
//   positions: n * H(p) bits   (H the binary entropy: which elements changed,
//                               if changes were independent and equally likely)
//   values:    c * H(D) bits   (H(D) the empirical entropy of the zigzag of the
//                               bit-pattern delta, (new - old) mod 2^w read as a
//                               signed w-bit integer)
// computed exactly from the data. It assumes nothing about the values beyond
// their empirical distribution, so a codec that models structure (per-tensor
// densities, clustering) may beat it; one that does not cannot.
//
// Thread safety: an EntropyCounter is not synchronized; Merge counters that
// were filled on different threads.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "tern/status.h"
#include "tern/view.h"

namespace tern::bench {

// (new - old) mod 2^bits as a signed bits-wide integer, zigzag-mapped so small
// magnitudes get small codes: 0->0, -1->1, +1->2, -2->3, ... bits in 1..64.
uint64_t ZigzagDelta(uint64_t old_bits, uint64_t new_bits, int bits);

// Binary entropy in bits, H(0) = H(1) = 0.
double BinaryEntropyBits(double p);

struct EntropyBound {
  uint64_t elements = 0;
  uint64_t changed = 0;
  double position_bits = 0;  // elements * H(changed / elements)
  double value_bits = 0;     // changed * empirical entropy of the zigzag deltas
  double value_bits_per_change() const { return changed ? value_bits / double(changed) : 0.0; }
  double total_bits() const { return position_bits + value_bits; }
  double total_bytes() const { return total_bits() / 8.0; }
  double bits_per_change() const { return changed ? total_bits() / double(changed) : 0.0; }
};

class EntropyCounter {
 public:
  // Counts the changes between two equal-length element arrays of `bits`
  // (8, 16, 32 or 64) bits each, little-endian. Byte lengths must match and be
  // a multiple of bits/8.
  Status Add(std::span<const uint8_t> old_bytes, std::span<const uint8_t> new_bytes, int bits);
  // Same, for every tensor of two views with identical layouts (packed 4-bit
  // tensors are unsupported).
  Status AddViews(const ServeView& old_view, const ServeView& new_view);
  void Merge(const EntropyCounter& other);

  EntropyBound Bound() const;
  uint64_t elements() const { return elements_; }
  uint64_t changed() const { return changed_; }

 private:
  uint64_t elements_ = 0;
  uint64_t changed_ = 0;
  // Zigzag deltas below 2^16 (nearly all of them) are counted in a flat table.
  std::vector<uint64_t> small_;
  std::unordered_map<uint64_t, uint64_t> large_;
};

// The same bound conditioned on the base element's exponent: elements are
// split into classes by the exponent field of their *old* value (known to the
// receiver, which holds the base), and each class pays n_e * H(p_e) for its
// positions plus c_e * H(D | e) for its values. Adam moves every weight by
// about the learning rate while the rounding step grows with |w|, so small
// weights flip far more often than large ones; a codec that models this can
// go below the unconditioned bound, and this says how far.
// Exponent fields: BF16 bits 7..14, F16 bits 10..14, F32 bits 23..30; other
// dtypes form one class (the plain bound).
class ExponentContextCounter {
 public:
  Status Add(std::span<const uint8_t> old_bytes, std::span<const uint8_t> new_bytes, DType dtype);
  Status AddViews(const ServeView& old_view, const ServeView& new_view);
  // Sum over classes; elements/changed are totals, position_bits and
  // value_bits the conditioned sums.
  EntropyBound Bound() const;

 private:
  struct Class {
    uint64_t elements = 0;
    uint64_t changed = 0;
    std::unordered_map<uint64_t, uint64_t> values;
  };
  // Key: dtype code << 16 | exponent.
  std::unordered_map<uint64_t, Class> classes_;
};

}  // namespace tern::bench
