#include "tern/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tern {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kCorrupt: return "corrupt";
    case Code::kNotFound: return "not found";
    case Code::kAlreadyExists: return "already exists";
    case Code::kIo: return "i/o error";
    case Code::kMismatch: return "mismatch";
    case Code::kUnsupported: return "unsupported";
    case Code::kOutOfRange: return "out of range";
    case Code::kResourceExhausted: return "resource exhausted";
    case Code::kUnavailable: return "unavailable";
    case Code::kTimeout: return "timeout";
    case Code::kCancelled: return "cancelled";
    case Code::kInternal: return "internal";
    case Code::kProtocol: return "protocol";
    case Code::kAuth: return "authentication";
  }
  return "unknown";
}

Status::Status(Code code, std::string message) {
  if (code != Code::kOk) state_ = std::make_unique<State>(State{code, std::move(message)});
}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  return *this;
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(state_->code)) + ": " + state_->message;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return Status();
  return Status(state_->code, std::string(context) + ": " + state_->message);
}

namespace internal {

std::string Where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line) + ": ";
}

void AssertFail(const char* file, int line, const char* expr, const std::string& message) {
  std::fprintf(stderr, "tern: assertion failed at %s:%d: %s %s\n", file, line, expr,
               message.c_str());
  std::abort();
}

Status ErrnoStatus(int err, const char* file, int line, const std::string& message) {
  char buf[256];
  const char* text = strerror_r(err, buf, sizeof buf);
  Code code = Code::kIo;
  if (err == ENOENT) code = Code::kNotFound;
  if (err == EEXIST) code = Code::kAlreadyExists;
  if (err == ETIMEDOUT) code = Code::kTimeout;
  if (err == ENOMEM) code = Code::kResourceExhausted;
  return Status(code, Where(file, line) + message + ": " + text);
}

}  // namespace internal
}  // namespace tern
