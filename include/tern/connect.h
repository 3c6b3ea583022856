// ConnectWait: Transport::Connect with a deadline per attempt and bounded
// retries with exponential backoff, for callers that want a connection or an
// error, not a callback.
//
// Thread safety: blocks the calling thread (never call it from a backend
// callback thread); any number of threads may call it at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/transport.h"

namespace tern {

struct RetryPolicy {
  uint32_t attempts = 5;
  uint64_t backoff_ms = 200;
  uint64_t backoff_ms_max = 5000;
};

// Connects, retrying kUnavailable/kTimeout failures with exponential backoff;
// each attempt waits at most timeout_ms (real time: it waits for the
// backend's callback). The backoff between attempts sleeps on `clock`, so a
// test on a FakeClock steps through the retries without sleeping.
TERN_EXPORT Result<std::shared_ptr<Connection>> ConnectWait(Transport& transport,
                                                            const std::string& address,
                                                            ConnectionHandlers handlers,
                                                            uint64_t timeout_ms,
                                                            const RetryPolicy& retry = {},
                                                            Clock& clock = SteadyClock());

}  // namespace tern
