// Scalar reference conversions shared by the casts, the quantizers and their
// tests. Not part of the public API.
#pragma once

#include <cstdint>

namespace tern::quant {

uint16_t F32BitsToBF16(uint32_t f32_bits);
uint16_t F32BitsToF16(uint32_t f32_bits);
uint32_t F16ToF32Bits(uint16_t f16_bits);

}  // namespace tern::quant
