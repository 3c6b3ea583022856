// Peer-supplied text (refusal reasons, file names from the wire) made safe
// for a one-line message or log: bytes outside printable ASCII, and '\',
// become \xNN. At most 4 output bytes per input byte.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

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

}  // namespace tern
