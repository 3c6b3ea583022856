// Peer-supplied text (refusal reasons, file names from the wire) made safe
// for a one-line message or log: bytes outside printable ASCII, and '\',
// become \xNN. At most 4 output bytes per input byte.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "tern/status.h"

namespace tern {

std::string Printable(std::string_view bytes);
// Whether every byte is printable ASCII (what Printable's output must be).
bool IsPrintable(std::string_view s);

// Lower-case hex of bytes ("0aff"), and back: false unless `hex` is exactly
// 2 * out.size() hex digits (either case).
std::string Hex(std::span<const uint8_t> bytes);
bool ParseHex(std::string_view hex, std::span<uint8_t> out);

// Whether a presented secret (a join token, a bearer token) equals the
// expected one, in time that depends on the length only: a prober learns
// nothing about how many leading bytes matched. The length is not secret.
bool SecretEquals(std::string_view expected, std::string_view given);

// Strict unsigned decimal: one or more ASCII digits and nothing else (no
// sign, space, "0x", exponent or fraction), at most `max`. kInvalidArgument
// for anything but digits, kOutOfRange beyond `max` (or 2^64 - 1); the
// messages quote the text, made Printable and cut to 64 bytes. Leading
// zeros are accepted ("007" is 7): fixed-width fields are written so.
Result<uint64_t> ParseDecimal(std::string_view text, uint64_t max = UINT64_MAX);
// As ParseDecimal, and the one spelling std::to_string writes: no leading
// zero except "0" itself (kInvalidArgument). For numbers that are names or
// keys, where "07" and "7" must not both mean 7.
Result<uint64_t> ParseCanonicalDecimal(std::string_view text, uint64_t max = UINT64_MAX);

// A listen or dial address: "HOST:PORT", or "[V6]:PORT" for an IPv6 host.
// HOST is non-empty printable ASCII without space, '/', '[' or ']', and
// without ':' unless in brackets; PORT is 1 to 5 digits, 0 to 65535 (0: any
// free port, for a listener); at most 300 bytes in all. kInvalidArgument
// otherwise, naming the address (Printable).
struct HostPort {
  std::string host;  // without the brackets
  uint16_t port = 0;
};
Result<HostPort> ParseHostPort(std::string_view address);
// The spelling ParseHostPort reads back: brackets around a host with ':'.
std::string FormatHostPort(const HostPort& address);
// Whether `host` (an address as ParseHostPort returns it, or "localhost")
// names this machine's loopback: 127.0.0.0/8 or ::1. Names other than
// "localhost" are not resolved (false).
bool IsLoopbackHost(const std::string& host);

// Whether an OpenSSL error text is the peer's alert about our certificate,
// its verdict on it: "tlsv13 alert certificate required", "tlsv1 alert
// unknown ca", "sslv3 alert bad certificate", "... certificate unknown",
// "... unsupported certificate", "... access denied", and "sslv3 alert
// handshake failure", which OpenSSL sends when its verify callback refuses a
// certificate. Not a record that failed on the wire ("... alert bad record
// mac"), nor a hang-up. Shared by the transport's TLS, the admin client
// and the etcd client, which all tell a refusal (kAuth) from a broken link
// (kUnavailable).
bool IsTlsCertificateAlert(std::string_view openssl_error);

}  // namespace tern
