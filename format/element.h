// Loads and stores of one element's raw bits by width (docs/format/patch.md
// §1, "Element values": little-endian; F4 element i is the low nibble of
// byte i/2 when i is even, else the high), as TERN_HD functions
// (format/hd.h) for patch/'s codec and gpu/'s kernels. Any alignment: the
// copies are memcpy's (one load on the CPU; the kernels use wider accesses
// where they know the alignment, gpu/kernels/device_access.cuh).
#pragma once

#include <cstdint>
#include <cstring>

#include "format/hd.h"

namespace tern::format {

template <int W>
TERN_HD uint64_t LoadElement(const uint8_t* data, uint64_t i) {
  if constexpr (W == 4) {
    return (data[i >> 1] >> ((i & 1) * 4)) & 15;
  } else if constexpr (W == 8) {
    return data[i];
  } else if constexpr (W == 16) {
    uint16_t v;
    memcpy(&v, data + i * 2, 2);
    return v;
  } else if constexpr (W == 32) {
    uint32_t v;
    memcpy(&v, data + i * 4, 4);
    return v;
  } else {
    uint64_t v;
    memcpy(&v, data + i * 8, 8);
    return v;
  }
}

template <int W>
TERN_HD void StoreElement(uint8_t* data, uint64_t i, uint64_t v) {
  if constexpr (W == 4) {
    const int shift = static_cast<int>(i & 1) * 4;
    data[i >> 1] = static_cast<uint8_t>((data[i >> 1] & ~(15 << shift)) | ((v & 15) << shift));
  } else if constexpr (W == 8) {
    data[i] = static_cast<uint8_t>(v);
  } else if constexpr (W == 16) {
    const uint16_t x = static_cast<uint16_t>(v);
    memcpy(data + i * 2, &x, 2);
  } else if constexpr (W == 32) {
    const uint32_t x = static_cast<uint32_t>(v);
    memcpy(data + i * 4, &x, 4);
  } else {
    memcpy(data + i * 8, &v, 8);
  }
}

// The same with the width known at run time (w: 4, 8, 16, 32 or 64).
TERN_HD uint64_t LoadElement(const uint8_t* data, uint64_t i, int w) {
  switch (w) {
    case 4:
      return LoadElement<4>(data, i);
    case 8:
      return LoadElement<8>(data, i);
    case 16:
      return LoadElement<16>(data, i);
    case 32:
      return LoadElement<32>(data, i);
    default:
      return LoadElement<64>(data, i);
  }
}
TERN_HD void StoreElement(uint8_t* data, uint64_t i, int w, uint64_t v) {
  switch (w) {
    case 4:
      return StoreElement<4>(data, i, v);
    case 8:
      return StoreElement<8>(data, i, v);
    case 16:
      return StoreElement<16>(data, i, v);
    case 32:
      return StoreElement<32>(data, i, v);
    default:
      return StoreElement<64>(data, i, v);
  }
}

}  // namespace tern::format
