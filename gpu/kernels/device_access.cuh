// Device-side element access and reductions shared by the codec kernels.
// Internal; CUDA sources only.
#pragma once

#include <cstdint>

#include "gpu/ops/codec_ops.h"

namespace tern::gpu {

// Element i's raw bits with one native load (tensor bytes are aligned to
// the element size; F4: the nibble of byte i/2).
__device__ __forceinline__ uint64_t LoadW(const uint8_t* data, uint64_t i, int w) {
  switch (w) {
    case 4: return (data[i >> 1] >> ((i & 1) * 4)) & 15;
    case 8: return data[i];
    case 16: return reinterpret_cast<const uint16_t*>(data)[i];
    case 32: return reinterpret_cast<const uint32_t*>(data)[i];
    default: return reinterpret_cast<const uint64_t*>(data)[i];
  }
}

// Stores for w >= 8; F4 bytes are assembled by the caller (two nibbles may
// belong to two threads).
__device__ __forceinline__ void StoreW(uint8_t* data, uint64_t i, int w, uint64_t v) {
  switch (w) {
    case 8: data[i] = static_cast<uint8_t>(v); break;
    case 16: reinterpret_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(v); break;
    case 32: reinterpret_cast<uint32_t*>(data)[i] = static_cast<uint32_t>(v); break;
    default: reinterpret_cast<uint64_t*>(data)[i] = v; break;
  }
}

// Adds a thread's four digest lanes into acc[0..3] (mod 2^64: the order of
// additions does not matter, so atomics give the exact sum).
__device__ __forceinline__ void WarpAddLanes(uint64_t a[4], unsigned long long* acc) {
  for (int l = 0; l < 4; ++l) {
    uint64_t v = a[l];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0 && v != 0) atomicAdd(acc + l, static_cast<unsigned long long>(v));
  }
}

}  // namespace tern::gpu
