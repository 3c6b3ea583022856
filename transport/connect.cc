// ConnectWait: the contract's Connect with a deadline and bounded retries.
#include "tern/connect.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace tern {

Result<std::shared_ptr<Connection>> ConnectWait(Transport& transport, const std::string& address,
                                                ConnectionHandlers handlers, uint64_t timeout_ms,
                                                const RetryPolicy& retry, Clock& clock) {
  uint64_t backoff_ms = retry.backoff_ms;
  Status last;
  for (uint32_t attempt = 0; attempt < std::max<uint32_t>(1, retry.attempts); ++attempt) {
    if (attempt > 0) {
      clock.SleepFor(std::chrono::milliseconds(backoff_ms));
      backoff_ms = std::min(retry.backoff_ms_max, backoff_ms * 2);
    }
    struct Slot {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      bool abandoned = false;
      Result<std::shared_ptr<Connection>> result{Status(Code::kTimeout, "connect timed out")};
    };
    auto slot = std::make_shared<Slot>();
    transport.Connect(address, handlers, [slot](Result<std::shared_ptr<Connection>> r) {
      std::unique_lock<std::mutex> lock(slot->mu);
      if (slot->abandoned) {
        lock.unlock();
        if (r.ok()) (*r)->Close();  // a late success must not leak an open connection
        return;
      }
      slot->result = std::move(r);
      slot->done = true;
      slot->cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(slot->mu);
    if (!slot->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return slot->done; })) {
      slot->abandoned = true;
      last = TERN_ERROR(kTimeout, "connect to ", address, " timed out after ", timeout_ms, " ms");
      continue;
    }
    if (slot->result.ok()) return slot->result;
    last = slot->result.status();
    if (last.code() != Code::kUnavailable && last.code() != Code::kTimeout) return last;
  }
  return last.WithContext("connect to " + address);
}

}  // namespace tern
