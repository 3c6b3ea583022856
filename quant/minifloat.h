// Scalar codecs for the small float formats the quantizers emit: FP8 E4M3FN
// and E5M2 (OCP FP8), FP4 E2M1 and the E8M0 scale (OCP Microscaling).
// Internal. The codecs themselves are format/minifloat.h, the one copy the GPU
// kernels (gpu/ops/cast_ops.h) share, so CPU and GPU codes agree by
// construction; this header keeps quant/'s names for them.
#pragma once

#include <cstdint>

#include "format/minifloat.h"

namespace tern::quant {

using MiniFloat = ::tern::minifloat::MiniFormat;

inline constexpr MiniFloat kE4M3 = ::tern::minifloat::E4M3();
inline constexpr MiniFloat kE5M2 = ::tern::minifloat::E5M2();
inline constexpr MiniFloat kE2M1 = ::tern::minifloat::E2M1();

using ::tern::minifloat::DecodeE8M0;
using ::tern::minifloat::DecodeMini;
using ::tern::minifloat::EncodeMini;

}  // namespace tern::quant
