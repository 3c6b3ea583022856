// The C API's versions, error codes and per-thread last error, and the
// checked copies of caller structs and text (capi_internal.h).
#include <algorithm>

#include "capi/capi_internal.h"

namespace tern::capi {
namespace {

// The C enum is the registry in status.h, number for number.
static_assert(TERN_OK == static_cast<int>(Code::kOk));
static_assert(TERN_INVALID_ARGUMENT == static_cast<int>(Code::kInvalidArgument));
static_assert(TERN_CORRUPT == static_cast<int>(Code::kCorrupt));
static_assert(TERN_NOT_FOUND == static_cast<int>(Code::kNotFound));
static_assert(TERN_ALREADY_EXISTS == static_cast<int>(Code::kAlreadyExists));
static_assert(TERN_IO == static_cast<int>(Code::kIo));
static_assert(TERN_MISMATCH == static_cast<int>(Code::kMismatch));
static_assert(TERN_UNSUPPORTED == static_cast<int>(Code::kUnsupported));
static_assert(TERN_OUT_OF_RANGE == static_cast<int>(Code::kOutOfRange));
static_assert(TERN_RESOURCE_EXHAUSTED == static_cast<int>(Code::kResourceExhausted));
static_assert(TERN_UNAVAILABLE == static_cast<int>(Code::kUnavailable));
static_assert(TERN_TIMEOUT == static_cast<int>(Code::kTimeout));
static_assert(TERN_CANCELLED == static_cast<int>(Code::kCancelled));
static_assert(TERN_INTERNAL == static_cast<int>(Code::kInternal));
static_assert(TERN_PROTOCOL == static_cast<int>(Code::kProtocol));
static_assert(TERN_AUTH == static_cast<int>(Code::kAuth));
constexpr int kLastKnownCode = TERN_AUTH;

// This thread's last error. A message that cannot be stored (out of memory)
// leaves `fallback` pointing at a static text instead.
thread_local std::string last_error;
thread_local const char* fallback = nullptr;

}  // namespace

tern_code Finish(const Status& status) noexcept {
  fallback = nullptr;
  try {
    if (status.ok()) {
      last_error.clear();
    } else {
      last_error = status.ToString();
    }
  } catch (...) {
    fallback = "resource_exhausted: out of memory while recording the error";
  }
  return static_cast<tern_code>(status.code());
}

Result<std::string> ReadString(const char* text, const char* field, size_t max_bytes) {
  if (text == nullptr) return std::string();
  const size_t n = strnlen(text, max_bytes + 1);
  TERN_REQUIRE(n <= max_bytes, kOutOfRange, field, ": longer than ", max_bytes, " bytes");
  return std::string(text, n);
}

Status ReadVersionedStruct(const void* theirs, void* ours, size_t our_bytes, size_t min_bytes,
                           const char* what) {
  TERN_REQUIRE(theirs != nullptr, kInvalidArgument, what, " is NULL");
  size_t size = 0;
  std::memcpy(&size, theirs, sizeof size);
  TERN_REQUIRE(size >= min_bytes && size <= kStructBytesMax, kInvalidArgument, what,
               ".struct_size is ", size, ": want sizeof(", what, ") (", our_bytes,
               " in this library; call its _init function)");
  const auto* bytes = static_cast<const unsigned char*>(theirs);
  if (size > our_bytes) {
    // A newer header's struct: fine while the fields we lack are unset.
    const bool zero =
        std::all_of(bytes + our_bytes, bytes + size, [](unsigned char b) { return b == 0; });
    TERN_REQUIRE(zero, kUnsupported, what, " has fields this library (ABI ", TERN_ABI_VERSION_MAJOR,
                 ".", TERN_ABI_VERSION_MINOR, ") does not know set (struct_size ", size, " > ",
                 our_bytes, ")");
  }
  std::memcpy(ours, theirs, std::min(size, our_bytes));
  std::memcpy(ours, &our_bytes, sizeof our_bytes);
  return Status::Ok();
}

Status WriteVersionedStruct(const void* ours, size_t our_bytes, void* theirs, size_t min_bytes,
                            const char* what) {
  TERN_REQUIRE(theirs != nullptr, kInvalidArgument, what, " is NULL");
  size_t size = 0;
  std::memcpy(&size, theirs, sizeof size);
  TERN_REQUIRE(size >= min_bytes && size <= kStructBytesMax, kInvalidArgument, what,
               ".struct_size is ", size, ": set it to sizeof(", what, ")");
  const size_t n = std::min(size, our_bytes);
  std::memcpy(static_cast<unsigned char*>(theirs) + sizeof size,
              static_cast<const unsigned char*>(ours) + sizeof size, n - sizeof size);
  return Status::Ok();
}

Status WriteText(std::string_view text, char* buf, size_t cap, size_t* len) {
  TERN_REQUIRE(len != nullptr, kInvalidArgument, "len is NULL");
  *len = text.size();
  TERN_REQUIRE(buf != nullptr || cap == 0, kInvalidArgument, "buf is NULL but cap is ", cap);
  TERN_REQUIRE(cap > text.size(), kResourceExhausted, "buffer too small: ", text.size() + 1,
               " bytes needed (the text and a NUL), cap is ", cap);
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  return Status::Ok();
}

}  // namespace tern::capi

extern "C" {

const char* tern_version(void) { return TERN_VERSION_STRING; }

uint32_t tern_abi_version(void) { return TERN_ABI_VERSION; }

const char* tern_code_name(int code) {
  if (code < 0 || code > tern::capi::kLastKnownCode) return "unknown";
  return tern::CodeName(static_cast<tern::Code>(code));
}

const char* tern_last_error(void) {
  if (tern::capi::fallback != nullptr) return tern::capi::fallback;
  return tern::capi::last_error.c_str();
}

}  // extern "C"
