// Loads and stores of one element's raw bits by width (format/element.h),
// and the dispatch from a run-time width to a compile-time one.
#pragma once

#include <cstdint>

#include "format/element.h"

namespace tern::patch {

// Element access is format/element.h's, shared with the GPU kernels.
using format::LoadElement;
using format::StoreElement;

// Calls fn.template operator()<W>() for the element width w.
template <class Fn>
inline decltype(auto) DispatchWidth(int w, Fn&& fn) {
  switch (w) {
    case 4: return fn.template operator()<4>();
    case 8: return fn.template operator()<8>();
    case 16: return fn.template operator()<16>();
    case 32: return fn.template operator()<32>();
    default: return fn.template operator()<64>();
  }
}

}  // namespace tern::patch
