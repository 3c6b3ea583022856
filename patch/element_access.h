// Loads and stores of one element's raw bits by width (spec "Element values":
// F4 element i is the low nibble of byte i/2 when i is even, else the high).
#pragma once

#include <cstdint>
#include <cstring>

namespace tern::patch {

template <int W>
inline uint64_t LoadElement(const uint8_t* data, uint64_t i) {
  if constexpr (W == 4) {
    return (data[i >> 1] >> ((i & 1) * 4)) & 15;
  } else if constexpr (W == 8) {
    return data[i];
  } else if constexpr (W == 16) {
    uint16_t v;
    std::memcpy(&v, data + i * 2, 2);
    return v;
  } else if constexpr (W == 32) {
    uint32_t v;
    std::memcpy(&v, data + i * 4, 4);
    return v;
  } else {
    uint64_t v;
    std::memcpy(&v, data + i * 8, 8);
    return v;
  }
}

template <int W>
inline void StoreElement(uint8_t* data, uint64_t i, uint64_t v) {
  if constexpr (W == 4) {
    const int shift = static_cast<int>(i & 1) * 4;
    data[i >> 1] = static_cast<uint8_t>((data[i >> 1] & ~(15 << shift)) | ((v & 15) << shift));
  } else if constexpr (W == 8) {
    data[i] = static_cast<uint8_t>(v);
  } else if constexpr (W == 16) {
    const uint16_t x = static_cast<uint16_t>(v);
    std::memcpy(data + i * 2, &x, 2);
  } else if constexpr (W == 32) {
    const uint32_t x = static_cast<uint32_t>(v);
    std::memcpy(data + i * 4, &x, 4);
  } else {
    std::memcpy(data + i * 8, &v, 8);
  }
}

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
