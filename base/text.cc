#include "base/text.h"

#include <cstdint>

namespace tern {

std::string Printable(std::string_view bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    if (b >= 0x20 && b < 0x7f && b != '\\') {
      out.push_back(c);
    } else {
      out += "\\x";
      out.push_back(kHex[b >> 4]);
      out.push_back(kHex[b & 15]);
    }
  }
  return out;
}

bool IsPrintable(std::string_view s) {
  for (char c : s) {
    if (static_cast<uint8_t>(c) < 0x20 || static_cast<uint8_t>(c) >= 0x7f) return false;
  }
  return true;
}

std::string Hex(std::span<const uint8_t> bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (uint8_t b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

bool ParseHex(std::string_view hex, std::span<uint8_t> out) {
  if (hex.size() != 2 * out.size()) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

bool SecretEquals(std::string_view expected, std::string_view given) {
  if (expected.size() != given.size()) return false;
  // The loop OpenSSL's CRYPTO_memcmp runs, written here so that base/ stays
  // free of OpenSSL: every byte is read, the differences are OR-ed, and the
  // accumulator is volatile so the compiler cannot stop at the first one.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff = diff | static_cast<uint8_t>(expected[i] ^ given[i]);
  }
  return diff == 0;
}

}  // namespace tern
