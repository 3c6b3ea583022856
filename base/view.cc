#include "tern/view.h"

#include <algorithm>

namespace tern {

uint64_t TensorDesc::elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

Result<uint64_t> CheckedElements(DType dtype, std::span<const uint64_t> shape) {
  constexpr uint64_t kMax = uint64_t{1} << 62;
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (d != 0 && n > kMax / d) return TERN_ERROR(kOutOfRange, "tensor shape overflows 2^62 elements");
    n *= d;
  }
  // Largest element is 8 bytes: 2^62 elements * 8 would overflow; cap bytes at 2^62.
  if (n > (kMax / 8)) return TERN_ERROR(kOutOfRange, "tensor of ", n, " elements is too large");
  (void)dtype;
  return n;
}

namespace {
template <class View>
Status SortAndCheckImpl(View& view) {
  std::sort(view.tensors.begin(), view.tensors.end(),
            [](const auto& a, const auto& b) { return a.desc->name < b.desc->name; });
  for (size_t i = 1; i < view.tensors.size(); ++i)
    if (view.tensors[i].desc->name == view.tensors[i - 1].desc->name)
      return TERN_ERROR(kInvalidArgument, "duplicate tensor name '", view.tensors[i].desc->name, "'");
  return Status::Ok();
}
}  // namespace

Status SortAndCheck(ServeView& view) { return SortAndCheckImpl(view); }
Status SortAndCheck(MutableServeView& view) { return SortAndCheckImpl(view); }

ServeView AsConst(const MutableServeView& view) {
  ServeView out;
  out.tensors.reserve(view.tensors.size());
  for (const auto& t : view.tensors) out.tensors.push_back(TensorRef{t.desc, t.data});
  return out;
}

}  // namespace tern
