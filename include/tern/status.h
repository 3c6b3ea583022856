// Status and Result<T>: tern's error type. No exceptions cross a library or C
// boundary; every fallible call returns one of these.
//
// Contract:
//  * Status is one pointer; OK is a null pointer, so success costs nothing.
//    Errors carry a numbered Code (the registry below; numbers are stable and
//    appear in the C API) and a one-line message with file:line context.
//  * "Bad input" (untrusted bytes, wrong arguments, a peer misbehaving) is a
//    Status. "Our bug" is TERN_ASSERT, which aborts.
//  * Thread safety: Status and Result are values; distinct objects may be used
//    from distinct threads, one object is not synchronized.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "tern/export.h"

namespace tern {

// The error-code registry. Append only; never renumber (the C API and logs
// carry these numbers).
enum class Code : uint16_t {
  kOk = 0,
  kInvalidArgument = 1,    // the caller asked for something impossible
  kCorrupt = 2,            // untrusted bytes failed validation
  kNotFound = 3,           // a named file, tensor, peer or version is absent
  kAlreadyExists = 4,      // refusing to overwrite
  kIo = 5,                 // an operating-system call failed (errno in message)
  kMismatch = 6,           // well-formed input that does not fit: wrong base,
                           // digest, name, shape or dtype
  kUnsupported = 7,        // valid but not implemented / not available here
  kOutOfRange = 8,         // a value outside its documented bounds
  kResourceExhausted = 9,  // a bound (memory, queue, count) was hit
  kUnavailable = 10,       // a peer, device or library is not reachable now
  kTimeout = 11,
  kCancelled = 12,
  kInternal = 13,          // an invariant failed in a way we report, not abort
  kProtocol = 14,          // a peer spoke another protocol or version
  kAuth = 15,              // authentication or authorization failed
};

// Stable lower-case name of a code ("corrupt", "mismatch", ...).
TERN_EXPORT const char* CodeName(Code code);

class [[nodiscard]] TERN_EXPORT Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message);
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  ~Status() = default;

  static Status Ok() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  Code code() const { return state_ ? state_->code : Code::kOk; }
  // The message without the code name; empty when OK.
  const std::string& message() const;
  // "corrupt: patch.cc:120: segment 3 checksum mismatch" or "ok".
  std::string ToString() const;

  // Prefix the message with context, keeping the code: "while applying x: ...".
  Status WithContext(std::string_view context) const;

  // Marks a status as deliberately ignored.
  void IgnoreError() const {}

 private:
  struct State {
    Code code;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

inline bool operator==(const Status& a, Code c) { return a.code() == c; }

// Result<T>: a T or a non-OK Status.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status(Code::kInternal, "Result built from OK status");
  }
  Result(const Result&) = default;
  Result(Result&&) noexcept = default;
  Result& operator=(const Result&) = default;
  Result& operator=(Result&&) noexcept = default;

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  Status take_status() && { return std::move(status_); }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

namespace internal {
template <class... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
TERN_EXPORT std::string Where(const char* file, int line);
[[noreturn]] TERN_EXPORT void AssertFail(const char* file, int line, const char* expr,
                                         const std::string& message);
TERN_EXPORT Status ErrnoStatus(int err, const char* file, int line, const std::string& message);
}  // namespace internal

}  // namespace tern

// Builds an error Status with file:line context: TERN_ERROR(kCorrupt, "bad ", n).
#define TERN_ERROR(code, ...)                                        \
  ::tern::Status(::tern::Code::code,                                 \
                 ::tern::internal::Where(__FILE__, __LINE__) +       \
                     ::tern::internal::StrCat(__VA_ARGS__))

// An I/O Status from errno (captured at the call): TERN_ERRNO("open ", path).
#define TERN_ERRNO(...) \
  ::tern::internal::ErrnoStatus(errno, __FILE__, __LINE__, ::tern::internal::StrCat(__VA_ARGS__))

// Validates untrusted input: returns the error Status when cond is false.
#define TERN_REQUIRE(cond, code, ...)                 \
  do {                                                \
    if (!(cond)) return TERN_ERROR(code, __VA_ARGS__); \
  } while (0)

#define TERN_RETURN_IF_ERROR(expr)           \
  do {                                       \
    ::tern::Status tern_status_ = (expr);    \
    if (!tern_status_.ok()) return tern_status_; \
  } while (0)

#define TERN_CONCAT_INNER_(a, b) a##b
#define TERN_CONCAT_(a, b) TERN_CONCAT_INNER_(a, b)
#define TERN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).take_status(); \
  lhs = std::move(tmp).value()
// TERN_ASSIGN_OR_RETURN(auto x, MakeX());
#define TERN_ASSIGN_OR_RETURN(lhs, expr) \
  TERN_ASSIGN_OR_RETURN_IMPL_(TERN_CONCAT_(tern_result_, __LINE__), lhs, expr)

// Our bug, never bad input: aborts with file:line.
#define TERN_ASSERT(cond, ...)                                                       \
  do {                                                                               \
    if (!(cond))                                                                     \
      ::tern::internal::AssertFail(__FILE__, __LINE__, #cond,                        \
                                   ::tern::internal::StrCat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
