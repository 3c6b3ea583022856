// Element casts from FP32 to the 16-bit serve dtypes, and back.
//
// Contract: the FP32 -> BF16 / FP16 casts round to nearest, ties to even, and
// match PyTorch's CPU `.to(torch.bfloat16)` / `.to(torch.float16)` bit for bit
// (checked against Debian's python3-torch by tests/python/test_cast_torch.py):
//  * -0, subnormals (FP16 keeps them; BF16 has FP32's exponent range), and
//    overflow to +-Inf follow IEEE 754 round-to-nearest-even.
//  * NaN: FP16 gives the canonical quiet NaN with the sign kept (0x7E00 /
//    0xFE00, payload dropped). BF16 gives 0xFFFF for every NaN, sign and payload
//    ignored, because that is what PyTorch's vectorized (AVX2/AVX-512) CPU
//    kernels write; its scalar fallback would write 0x7FC0 instead.
//  * The widening casts are exact; NaN payloads are kept (FP16 signalling
//    NaNs come back quieted, as the hardware and PyTorch do).
// The results do not depend on the CPU, the MXCSR (FTZ/DAZ) state or n.
//
// Thread safety: pure functions; `in` and `out` must not overlap.
#pragma once

#include <cstdint>

#include "tern/export.h"

namespace tern {

TERN_EXPORT void CastF32ToBF16(const float* in, uint16_t* out, uint64_t n);
TERN_EXPORT void CastF32ToF16(const float* in, uint16_t* out, uint64_t n);
TERN_EXPORT float BF16ToF32(uint16_t bits);
TERN_EXPORT float F16ToF32(uint16_t bits);

// Bulk widening casts (exact).
TERN_EXPORT void CastBF16ToF32(const uint16_t* in, float* out, uint64_t n);
TERN_EXPORT void CastF16ToF32(const uint16_t* in, float* out, uint64_t n);

}  // namespace tern
