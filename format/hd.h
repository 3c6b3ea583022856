// Portability floor of host/device code: functions marked TERN_HD compile for
// the host (GCC) and for the device (nvcc), so that every GPU kernel's
// per-element and per-segment logic is the same source on both sides and the
// CPU test suite checks it against the CPU reference bit for bit; code both
// sides share outright (format/minifloat.h, quant/'s and gpu/'s one copy)
// lives on it too. The floor of format/, so that patch/, quant/ and gpu/ may
// include it.
//
// Rules for TERN_HD code: no std:: library calls that lack device versions
// (no <cmath>, no std::vector, no Status), no exceptions, every loop bounded
// by its arguments. Float math must be IEEE round-to-nearest-even with no
// contraction: the .cu files build with --fmad=false and without fast math,
// the host side with -ffp-contract=off (ISO C++ mode, as all of tern).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TERN_HD __host__ __device__ __forceinline__
#define TERN_HD_ALWAYS_INLINE __host__ __device__ __forceinline__
#else
#define TERN_HD inline
// For the few per-symbol functions that the CPU's decode loops call once
// per change, where an out-of-line call would cost as much as the work.
#define TERN_HD_ALWAYS_INLINE [[gnu::always_inline]] inline
#endif

namespace tern::hd {

// std::bit_cast, which device code lacks (nvcc turns the copy into a move).
template <class To, class From>
TERN_HD To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}
TERN_HD uint32_t FloatBits(float f) { return BitCast<uint32_t>(f); }
TERN_HD float BitsFloat(uint32_t u) { return BitCast<float>(u); }

// Count of leading / trailing zero bits; 64 for x == 0.
TERN_HD int Clz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(x));
#else
  return x == 0 ? 64 : __builtin_clzll(x);
#endif
}
TERN_HD int Ctz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return x == 0 ? 64 : __ffsll(static_cast<long long>(x)) - 1;
#else
  return x == 0 ? 64 : __builtin_ctzll(x);
#endif
}

TERN_HD float AbsF(float x) { return BitsFloat(FloatBits(x) & 0x7FFFFFFFu); }
TERN_HD bool IsNan(float x) { return (FloatBits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
TERN_HD bool IsFinite(float x) { return (FloatBits(x) & 0x7F800000u) != 0x7F800000u; }
// std::fmax semantics (a NaN argument loses), for amax reductions.
TERN_HD float MaxF(float a, float b) {
  if (IsNan(a)) return b;
  if (IsNan(b)) return a;
  return a < b ? b : a;
}

// 2^e exactly, for e in [-149, 127] (subnormals included).
TERN_HD float Pow2(int e) {
  if (e >= -126) return BitsFloat(static_cast<uint32_t>(e + 127) << 23);
  return BitsFloat(uint32_t{1} << (e + 149));
}

}  // namespace tern::hd

// The GPU path's code calls these unqualified.
namespace tern::gpu {
using namespace ::tern::hd;
}  // namespace tern::gpu
