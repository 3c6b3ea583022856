// FetchFile (tern/xfer.h): one run of `tern xfer get`. Attempts (attempt.h)
// are retried with backoff on errors a new connection can cure; the copy
// lives in a PartFile (part_file.h) that is committed to LOCAL once its
// whole-file hash matched, and otherwise kept for a later run only when it
// can be resumed.
#include <algorithm>
#include <chrono>

#include "tern/xfer.h"
#include "xfer/fetch/attempt.h"
#include "xfer/fetch/part_file.h"

namespace tern {

namespace {

class Fetch {
 public:
  Fetch(Transport& t, const std::string& address, const std::string& name, const std::string& local,
        const FetchOptions& o, Clock& clock)
      : t_(t), address_(address), name_(name), local_(local), o_(o), clock_(clock),
        part_(t, local, o.chunk_bytes, o.resume) {}

  Result<FetchResult> Run() {
    start_us_ = clock_.NowUs();
    if (o_.resume) part_.LoadResume();
    const bool resumed = part_.resumed_bytes() > 0;
    Result<FetchResult> done = Once();
    // A resumed copy can fail its final check through no fault of this run
    // (a damaged partial file, state saved before a power loss): the copy
    // was discarded, so one more run from zero fixes it.
    if (!done.ok() && done.status().code() == Code::kCorrupt && resumed) {
      part_.Discard();
      done = Once();
    }
    return done;
  }

 private:
  Result<FetchResult> Once() {
    Status st = Attempts();
    if (st.ok()) return Commit();
    part_.Abandon();  // a copy that cannot be resumed goes now
    return st;
  }

  // Attempts until one completes the copy, the error is not one a new
  // connection cures, or the retries are spent.
  Status Attempts() {
    uint64_t backoff_ms = o_.retry.backoff_ms;
    const xfer::AttemptContext cx{t_, address_, name_, o_, clock_, part_, [this] { Report(); }};
    for (uint32_t attempt = 0;; ++attempt) {
      Status st = xfer::RunAttempt(cx, log_);
      if (st.ok()) return st;
      if (part_.discard_pending()) part_.Discard();
      const bool retryable =
          st.code() == Code::kUnavailable || st.code() == Code::kTimeout || st.code() == Code::kCorrupt;
      part_.SaveState();
      if (!retryable || attempt + 1 >= std::max<uint32_t>(1, o_.retry.attempts)) return st;
      ++reconnects_;
      clock_.SleepFor(std::chrono::milliseconds(backoff_ms));
      backoff_ms = std::min(o_.retry.backoff_ms_max, backoff_ms * 2);
    }
  }

  Result<FetchResult> Commit() {
    Report();
    const uint64_t size = part_.progress().total_bytes;
    TERN_ASSIGN_OR_RETURN(uint64_t xxh3, part_.Commit(local_, name_));
    FetchResult r;
    r.bytes = size;
    r.resumed_bytes = part_.resumed_bytes();
    r.xxh3 = xxh3;
    r.reconnects = reconnects_;
    r.seconds = (clock_.NowUs() - start_us_) / 1e6;
    const uint64_t first = log_.first_landed_us.load();
    if (first != 0) r.first_chunk_seconds = (first - start_us_) / 1e6;
    r.link = log_.link;
    return r;
  }

  void Report() {
    if (!o_.on_progress) return;
    const xfer::PartFile::Progress p = part_.progress();
    FetchProgress out;
    out.total_bytes = p.total_bytes;
    out.done_bytes = p.done_bytes;
    out.resumed_bytes = part_.resumed_bytes();
    out.seconds = (clock_.NowUs() - start_us_) / 1e6;
    o_.on_progress(out);
  }

  Transport& t_;
  const std::string address_, name_, local_;
  const FetchOptions& o_;
  Clock& clock_;
  uint64_t start_us_ = 0;
  uint32_t reconnects_ = 0;
  xfer::AttemptLog log_;
  xfer::PartFile part_;  // last: unmapped before the rest goes
};

}  // namespace

Result<FetchResult> FetchFile(Transport& transport, const std::string& address, const std::string& remote_name,
                              const std::string& local_path, const FetchOptions& options, Clock& clock) {
  TERN_REQUIRE(options.chunk_bytes >= 4096 && options.chunk_bytes <= kMaxChunkBytes, kInvalidArgument,
               "chunk size ", options.chunk_bytes, " outside [4096, ", kMaxChunkBytes, "]");
  Fetch fetch(transport, address, remote_name, local_path, options, clock);
  return fetch.Run();
}

}  // namespace tern
