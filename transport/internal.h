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

#include "base/hash.h"
#include "base/log.h"
#include "base/text.h"
#include "base/thread_tracker.h"
#include "tern/transport.h"

namespace tern::transport {

// Moved down to base (xfer and the backends share them); the names stay
// here so backend code reads the same.
using ::tern::IsPrintable;
using ::tern::LogLine;
using ::tern::Printable;
using ::tern::ThreadTracker;
using ::tern::Xxh3;

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

}  // namespace tern::transport
