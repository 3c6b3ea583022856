#include "base/text.h"

#include <arpa/inet.h>
#include <netinet/in.h>

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

namespace {

// Quoted for an error message, cut so one bad argument keeps it one line.
std::string Quote(std::string_view text) {
  return "'" + Printable(text.substr(0, 64)) + (text.size() > 64 ? "...'" : "'");
}

}  // namespace

Result<uint64_t> ParseDecimal(std::string_view text, uint64_t max) {
  TERN_REQUIRE(!text.empty(), kInvalidArgument, "'' is not an unsigned decimal integer");
  uint64_t v = 0;
  bool overflow = false;
  for (char c : text) {
    TERN_REQUIRE(c >= '0' && c <= '9', kInvalidArgument, Quote(text),
                 " is not an unsigned decimal integer");
    overflow = overflow || __builtin_mul_overflow(v, 10, &v) ||
               __builtin_add_overflow(v, static_cast<uint64_t>(c - '0'), &v);
  }
  TERN_REQUIRE(!overflow && v <= max, kOutOfRange, Quote(text), " is larger than ", max);
  return v;
}

Result<uint64_t> ParseCanonicalDecimal(std::string_view text, uint64_t max) {
  TERN_REQUIRE(text.size() <= 1 || text[0] != '0', kInvalidArgument, Quote(text),
               " has a leading zero");
  return ParseDecimal(text, max);
}

Result<HostPort> ParseHostPort(std::string_view address) {
  TERN_REQUIRE(address.size() <= 300, kInvalidArgument, "address longer than 300 bytes");
  const size_t colon = address.rfind(':');
  TERN_REQUIRE(colon != std::string_view::npos, kInvalidArgument, "address ", Quote(address),
               ": want HOST:PORT");
  std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else {
    TERN_REQUIRE(host.find(':') == std::string_view::npos, kInvalidArgument, "address ",
                 Quote(address), ": an IPv6 host goes in brackets, [::1]:PORT");
  }
  TERN_REQUIRE(
      !host.empty() && IsPrintable(host) && host.find_first_of(" /[]") == std::string_view::npos,
      kInvalidArgument, "address ", Quote(address), ": bad host");
  auto p = ParseDecimal(port, 65535);
  TERN_REQUIRE(port.size() <= 5 && p.ok(), kInvalidArgument, "address ", Quote(address),
               ": bad port (want 0 to 65535)");
  return HostPort{std::string(host), static_cast<uint16_t>(*p)};
}

std::string FormatHostPort(const HostPort& address) {
  const bool v6 = address.host.find(':') != std::string::npos;
  return (v6 ? "[" + address.host + "]" : address.host) + ":" + std::to_string(address.port);
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

bool IsTlsCertificateAlert(std::string_view openssl_error) {
  if (openssl_error.find("alert") == std::string_view::npos) return false;
  for (std::string_view about : {"certificate", "unknown ca", "access denied", "handshake failure"})
    if (openssl_error.find(about) != std::string_view::npos) return true;
  return false;
}

}  // namespace tern
