// A serve view in memory: named tensors, each a dtype, a shape and its bytes.
//
// This is the common currency of the codec, checkpoint I/O, digests and the
// GPU path. A view does not own tensor bytes: they live in an mmapped
// checkpoint, a host buffer or (later) registered GPU memory, and must outlive
// the view. Tensors are kept sorted by name (byte-wise), which is the order
// digests and patches use.
//
// Thread safety: a const ServeView may be read from many threads; writers of
// a MutableServeView's bytes must not overlap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tern/dtype.h"
#include "tern/export.h"
#include "tern/status.h"

namespace tern {

struct TensorDesc {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;

  // Product of shape (1 for a scalar); callers validate overflow on untrusted
  // shapes with CheckedElements first.
  uint64_t elements() const;
  uint64_t bytes() const { return DTypeBytes(dtype, elements()); }
  bool SameLayout(const TensorDesc& other) const {
    return name == other.name && dtype == other.dtype && shape == other.shape;
  }
};

// Elements of a shape, or kOutOfRange when the product overflows 2^63 or a
// byte count would.
TERN_EXPORT Result<uint64_t> CheckedElements(DType dtype, std::span<const uint64_t> shape);

template <class Byte>
struct BasicTensorRef {
  const TensorDesc* desc = nullptr;
  Byte* data = nullptr;  // desc->bytes() bytes
};
using TensorRef = BasicTensorRef<const uint8_t>;
using MutableTensorRef = BasicTensorRef<uint8_t>;

template <class Byte>
class BasicServeView {
 public:
  // Tensors must be sorted by name without duplicates (see SortAndCheck).
  std::vector<BasicTensorRef<Byte>> tensors;

  // A binary search over the sorted tensors (a MoE checkpoint's view holds
  // ~1e5 of them, and `tern cast` looks every one up: a linear scan made
  // that quadratic). A view built without SortAndCheck still finds its
  // tensors, by the scan the search falls back to on a miss (so a miss
  // costs a scan: callers that expect many misses should sort and use
  // FindSorted).
  const BasicTensorRef<Byte>* Find(std::string_view name) const {
    if (const auto* t = FindSorted(name)) return t;
    for (const auto& t : tensors)
      if (t.desc->name == name) return &t;
    return nullptr;
  }
  // The binary search alone: finds every tensor of a sorted view. Written
  // out rather than std::lower_bound, whose precondition (a sorted range)
  // Find does not promise: on any order this loop is defined, and misses.
  const BasicTensorRef<Byte>* FindSorted(std::string_view name) const {
    size_t lo = 0, hi = tensors.size();
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (std::string_view(tensors[mid].desc->name) < name)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo < tensors.size() && tensors[lo].desc->name == name ? &tensors[lo] : nullptr;
  }
  uint64_t total_bytes() const {
    uint64_t n = 0;
    for (const auto& t : tensors) n += t.desc->bytes();
    return n;
  }
  uint64_t total_elements() const {
    uint64_t n = 0;
    for (const auto& t : tensors) n += t.desc->elements();
    return n;
  }
};
using ServeView = BasicServeView<const uint8_t>;
using MutableServeView = BasicServeView<uint8_t>;

// Sorts tensors by name and rejects duplicates (kInvalidArgument).
TERN_EXPORT Status SortAndCheck(ServeView& view);
TERN_EXPORT Status SortAndCheck(MutableServeView& view);
TERN_EXPORT ServeView AsConst(const MutableServeView& view);

}  // namespace tern
