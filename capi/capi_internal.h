// What capi/'s files share: the thread's last error, the guard that turns
// a Status (or an exception) into a tern_code at the C boundary, and the
// checked readers of caller memory (strings, option structs, text out).
// Nothing here is exported; include/tern/tern.h is the contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "tern/status.h"
#include "tern/tern.h"

namespace tern::capi {

// Records `status` as this thread's last error ("" when OK) and returns its
// code. Never throws.
tern_code Finish(const Status& status) noexcept;

// Runs `body` (returning Status) and converts whatever comes out, exceptions
// included, into a tern_code with the thread's last error set.
template <class Body>
tern_code Guard(Body&& body) noexcept {
  try {
    return Finish(body());
  } catch (const std::bad_alloc&) {
    return Finish(Status(Code::kResourceExhausted, "out of memory"));
  } catch (const std::exception& e) {
    return Finish(Status(Code::kInternal, std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return Finish(Status(Code::kInternal, "unexpected exception of unknown type"));
  }
}

// Bounds on what the caller hands in (tern.h promises errors, not reads
// without end, for absurd input).
inline constexpr size_t kStringBytesMax = 64 << 10;  // addresses, paths, tokens, ids
inline constexpr size_t kPemBytesMax = 64 << 10;     // one key
inline constexpr size_t kTrustedKeysMax = 64;
inline constexpr size_t kStructBytesMax = 64 << 10;  // a struct_size beyond this is garbage
// The result struct's size in ABI 1.0: the least a caller may pass.
inline constexpr size_t kStatusBytesV1 = offsetof(tern_status, members_at_head) + sizeof(uint32_t);

// A NUL-terminated string of at most `max_bytes`; NULL is "". `field` names
// it in the error.
Result<std::string> ReadString(const char* text, const char* field,
                               size_t max_bytes = kStringBytesMax);

// Copies the caller's versioned struct (first member: size_t struct_size)
// over `*ours`, which holds the defaults: only the caller's first
// struct_size bytes; a caller struct larger than ours is accepted only if
// the bytes we do not know are zero. `min_bytes`: the size of the first ABI
// version of the struct.
Status ReadVersionedStruct(const void* theirs, void* ours, size_t our_bytes, size_t min_bytes,
                           const char* what);
// Writes `ours` into the caller's versioned result struct, at most its
// struct_size bytes (the struct_size field itself is left as the caller set it).
Status WriteVersionedStruct(const void* ours, size_t our_bytes, void* theirs, size_t min_bytes,
                            const char* what);

// Text out (tern.h, "Errors"): *len = text size; copies text and a NUL when
// cap > size, else kResourceExhausted.
Status WriteText(std::string_view text, char* buf, size_t cap, size_t* len);

}  // namespace tern::capi
