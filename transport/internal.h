// Helpers shared by the backends; not part of the public API.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tern/transport.h"

namespace tern::transport_internal {

uint64_t Xxh3(const void* data, uint64_t size_bytes);

// Backend threads run detached (a connection may be released from its own
// callback, where a join would deadlock); the owner waits for all of them in
// its destructor instead. The function must not touch the owner after it
// returns: the count drops after it.
class ThreadTracker {
 public:
  ~ThreadTracker() { WaitAll(); }
  void Spawn(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++live_;
    }
    std::thread([this, fn = std::move(fn)]() mutable {
      fn();
      fn = nullptr;  // release captures before we signal
      std::lock_guard<std::mutex> lock(mu_);
      if (--live_ == 0) cv_.notify_all();
    }).detach();
  }
  void WaitAll() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return live_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t live_ = 0;
};

// A listener's accept handler behind a gate, so that Listener::Close() can
// keep its promise (transport.h): once it returned, the handler is not
// running on another thread and is never called again. A connection that
// finishes its handshake after that is refused.
class AcceptGate {
 public:
  explicit AcceptGate(AcceptHandler on_accept) : on_accept_(std::move(on_accept)) {}

  // Runs the handler, then `adopt` with the handlers it returned (the
  // backend starting the connection), both inside the gate; false, and
  // neither runs, once the gate is closed.
  bool Call(std::shared_ptr<Connection> conn, const std::function<void(ConnectionHandlers)>& adopt) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      callers_.push_back(std::this_thread::get_id());
    }
    adopt(on_accept_(std::move(conn)));
    std::lock_guard<std::mutex> lock(mu_);
    callers_.erase(std::find(callers_.begin(), callers_.end(), std::this_thread::get_id()));
    cv_.notify_all();
    return true;
  }

  // Closes the gate and waits for calls in progress. Called from inside a
  // handler (a handler may close its own listener) it only closes: two
  // handlers closing their listener at once must not wait for each other.
  void Close() {
    std::unique_lock<std::mutex> lock(mu_);
    closed_ = true;
    if (std::find(callers_.begin(), callers_.end(), std::this_thread::get_id()) != callers_.end()) return;
    cv_.wait(lock, [&] { return callers_.empty(); });
  }

 private:
  const AcceptHandler on_accept_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::vector<std::thread::id> callers_;  // one entry per call in progress
};

// Little-endian field codecs for the small handshake/control encodings of
// the UCX and verbs backends. Callers check `in` holds at + bytes first.
inline void PutLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
inline uint64_t GetLe(std::string_view in, size_t at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
  return value;
}

// The status a peer reports as a wire code (TCP HELLO_ACK and ACK, verbs
// ACK): OK for 0, the registered code otherwise (kInternal for numbers we do
// not know), with "peer: " + what as its message.
inline Status StatusFromWireCode(uint64_t code, std::string_view what) {
  if (code == 0) return Status::Ok();
  const Code c = code <= static_cast<uint64_t>(Code::kAuth) ? static_cast<Code>(code) : Code::kInternal;
  return Status(c, "peer: " + std::string(what));
}

// Calls a completion if set; completions are optional for callers.
inline void Complete(const Completion& done, Status status) {
  if (done) done(std::move(status));
}

// The ranges of a one-sided Write (backends with kCapOneSidedWrite): the
// source inside its registered region (kInvalidArgument) and the
// destination inside the `exported_bytes` the peer's key covers
// (kOutOfRange). `backend` prefixes the message ("ucx", "verbs").
Status CheckWriteRanges(std::string_view backend, const MemoryRegion& src, uint64_t src_offset,
                        uint64_t exported_bytes, uint64_t dst_offset, uint64_t length);

// Default logger: one line on stderr.
void LogLine(const LogFn& log, std::string_view line);

// Peer-supplied text (refusal reasons) made safe for one log line: bytes
// outside printable ASCII become \xNN. At most 4 output bytes per input byte.
std::string Printable(std::string_view bytes);
// Whether every byte is printable ASCII (what Printable's output must be).
inline bool IsPrintable(std::string_view s) {
  for (char c : s) {
    if (static_cast<uint8_t>(c) < 0x20 || static_cast<uint8_t>(c) >= 0x7f) return false;
  }
  return true;
}

}  // namespace tern::transport_internal
