// One fetch attempt over one connection (attempt.h).
#include "xfer/fetch/attempt.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "xfer/xfer_wire.h"

namespace tern::xfer {

namespace {

// What the server sent, and whether the connection or the copy ended.
struct Inbox {
  static constexpr size_t kMaxMessages = 64;  // the server answers each request once
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> messages;
  bool closed = false;
  bool landed_all = false;  // the last missing chunk landed
  Status why;
};

// Closes the attempt's receive windows and then its connection on every
// way out (before the head window is unmapped: see RunAttempt).
struct Closer {
  std::shared_ptr<Connection> c;
  std::vector<uint64_t> posted;  // the open receive windows
  void Cancel() {
    for (uint64_t id : posted) c->CancelReceive(id);
    posted.clear();
  }
  ~Closer() {
    Cancel();
    c->Close();
  }
};

class Attempt {
 public:
  Attempt(const AttemptContext& cx, AttemptLog& log) : cx_(cx), o_(cx.options), log_(log) {}

  Status Run() {
    ConnectionHandlers h;
    h.on_message = [inbox = inbox_](std::string m) {
      std::lock_guard<std::mutex> lock(inbox->mu);
      if (inbox->messages.size() < Inbox::kMaxMessages) {
        inbox->messages.push_back(std::move(m));
      } else if (!inbox->closed) {
        inbox->closed = true;
        inbox->why = TERN_ERROR(kProtocol, "server sent more than 64 unrequested messages");
      }
      inbox->cv.notify_all();
    };
    h.on_closed = [inbox = inbox_](Status why) {
      std::lock_guard<std::mutex> lock(inbox->mu);
      if (inbox->closed) return;  // already failed (a message flood)
      inbox->closed = true;
      inbox->why = why.ok() ? TERN_ERROR(kUnavailable, "server closed the connection") : why;
      inbox->cv.notify_all();
    };
    RetryPolicy connect_retry = o_.retry;
    TERN_ASSIGN_OR_RETURN(auto conn, ConnectWait(cx_.transport, cx_.address, h, o_.connect_timeout_ms,
                                                 connect_retry, cx_.clock));
    log_.link = conn->Describe();
    // Declared before the closer, so it runs after the windows are closed.
    struct HeadUnmapper {
      PartFile& part;
      ~HeadUnmapper() { part.UnmapHead(); }
    } head_unmapper{cx_.part};
    Closer closer{conn, {}};
    return Exchange(*conn, closer);
  }

 private:
  Status Exchange(Connection& conn, Closer& closer) {
    PartFile& part = cx_.part;
    const uint64_t get_id = ++log_.last_window;
    const PartFile::Held held = part.held();
    GetRequest get{o_.chunk_bytes, get_id, cx_.name, held.size_bytes, held.tag, held.bitmap, 0, o_.access_token};
    if (held.tag != 0 && held.size_bytes > 0) {
      // A version held: its window opens before GET (no WANT round trip).
      TERN_RETURN_IF_ERROR(conn.PostReceive(get_id, part.region(), 0, held.size_bytes, Landing()));
      closer.posted.push_back(get_id);
    } else if (held.tag == 0 && o_.head_bytes > 0) {
      // A fresh copy: the size is not known yet, but the start of the file
      // can already receive, so the first chunks need no WANT round trip. A
      // disk too small for the head (a small file onto a small disk) goes
      // without one: the first chunks then wait for WANT.
      if (part.MapHead(o_.head_bytes).ok()) {
        TERN_RETURN_IF_ERROR(conn.PostReceive(get_id, part.head_region(), 0, part.head_bytes(), Landing()));
        closer.posted.push_back(get_id);
        get.head_bytes = part.head_bytes();
      } else {
        TERN_RETURN_IF_ERROR(part.DropHead());
      }
    }
    conn.SendMessage(EncodeGet(get), nullptr);
    TERN_ASSIGN_OR_RETURN(std::string reply, Next(o_.connect_timeout_ms));
    if (TypeOf(reply) == kError) {
      Status refused;
      TERN_RETURN_IF_ERROR(DecodeStatus(reply, kError, &refused));
      return refused.ok() ? TERN_ERROR(kProtocol, "server sent an error without a code") : refused;
    }
    TERN_ASSIGN_OR_RETURN(Info info, DecodeInfo(reply));
    TERN_REQUIRE(info.transfer_id == get_id, kProtocol, "INFO for transfer ", info.transfer_id, ", asked ", get_id);
    // Bounded before the partial file is sized or the chunk map allocated.
    TERN_RETURN_IF_ERROR(ChunkCount(info.size_bytes, o_.chunk_bytes).status());
    const bool same_version = get.have_tag == info.tag && get.have_size == info.size_bytes;
    TERN_REQUIRE(!info.sending() || same_version, kProtocol,
                 "server sends without WANT for a version this client does not hold");
    TERN_REQUIRE(!info.head() || (get.head_bytes > 0 && info.size_bytes > 0), kProtocol,
                 "server sends a head this client did not open");
    if (!same_version) {
      if (!info.head()) closer.Cancel();  // nothing lands in the old copy from here on
      TERN_RETURN_IF_ERROR(part.Prepare(info.size_bytes, info.tag));
    }
    if (info.hash_known()) TERN_RETURN_IF_ERROR(part.LearnHash(info.xxh3, cx_.name));
    landed_us_ = cx_.clock.NowUs();
    const uint64_t size = info.size_bytes;
    const bool head_is_all = info.head() && size <= get.head_bytes;
    if (!info.sending() && !head_is_all) {
      if (!info.head()) closer.Cancel();  // the head window stays: its chunks are coming
      const uint64_t window = ++log_.last_window;
      if (size > 0) {
        TERN_RETURN_IF_ERROR(conn.PostReceive(window, part.region(), 0, size, Landing()));
        closer.posted.push_back(window);
      }
      // Chunks land meanwhile: the bitmap is read after the window opened.
      conn.SendMessage(EncodeWant(window, part.held().bitmap), nullptr);
    }
    return Await(get_id, info.hash_known(), size);
  }

  // Chunks land and HASH/DONE arrive until the copy is complete.
  Status Await(uint64_t get_id, bool hash_message_seen, uint64_t size) {
    PartFile& part = cx_.part;
    uint64_t last_save_us = cx_.clock.NowUs(), last_report_us = 0, complete_us = 0;
    for (;;) {
      std::string msg;
      bool closed = false;
      Status why;
      {
        std::unique_lock<std::mutex> lock(inbox_->mu);
        inbox_->cv.wait_for(lock, std::chrono::milliseconds(100), [&] {
          return inbox_->closed || inbox_->landed_all || !inbox_->messages.empty();
        });
        inbox_->landed_all = false;
        if (!inbox_->messages.empty()) {
          msg = std::move(inbox_->messages.front());
          inbox_->messages.pop_front();
        } else if (inbox_->closed) {
          closed = true;
          why = inbox_->why;
        }
      }
      const uint64_t now = cx_.clock.NowUs();
      if (now - last_report_us > 250000) {
        if (cx_.report) cx_.report();
        last_report_us = now;
      }
      if (now - last_save_us > 1000000) {
        part.SaveState();
        last_save_us = now;
      }
      if (TypeOf(msg) == kHash) {
        TERN_ASSIGN_OR_RETURN(HashMsg hash, DecodeHash(msg));
        TERN_REQUIRE(!hash_message_seen, kProtocol, "server sent the whole-file hash twice");
        TERN_REQUIRE(hash.transfer_id == get_id, kProtocol, "HASH for transfer ", hash.transfer_id, ", asked ",
                     get_id);
        hash_message_seen = true;
        TERN_RETURN_IF_ERROR(part.LearnHash(hash.xxh3, cx_.name));
      } else if (!msg.empty()) {
        Status finished;
        TERN_RETURN_IF_ERROR(DecodeStatus(msg, kDone, &finished));
        TERN_RETURN_IF_ERROR(finished);
        const PartFile::Progress p = part.progress();
        TERN_REQUIRE(p.complete, kProtocol, "server finished with chunks missing");
        TERN_REQUIRE(p.hash_known, kProtocol, "server finished without the whole-file hash");
        return Status::Ok();
      }
      const PartFile::Progress p = part.progress();
      // Every chunk and the hash: done, without waiting a round trip for DONE.
      if (p.complete && p.hash_known) return Status::Ok();
      if (closed) return why;
      // landed_us_ is stamped by stream threads and may be later than `now`
      // (read before it): without the guard the difference wraps and a busy
      // transfer is reported as stalled. Only a chunk not held before stamps
      // it, so duplicates cannot keep a stalled fetch alive.
      const uint64_t landed = landed_us_.load();
      if (!p.complete) {
        TERN_REQUIRE(now <= landed || now - landed <= o_.stall_timeout_ms * 1000, kTimeout,
                     "no new chunk landed for ", o_.stall_timeout_ms, " ms");
      } else {
        // Every chunk is here and the hash is not: the server may still be
        // hashing (in the background, behind other files). It gets the stall
        // timeout plus the file's size at 50 MB/s, still a bound.
        if (complete_us == 0) complete_us = std::max(now, landed);
        const uint64_t allowed_us = o_.stall_timeout_ms * 1000 + size / 50;
        TERN_REQUIRE(now <= complete_us || now - complete_us <= allowed_us, kTimeout, "no whole-file hash ",
                     allowed_us / 1000, " ms after the last chunk");
      }
    }
  }

  ChunkLanded Landing() {
    return [this, inbox = inbox_](uint64_t offset, uint64_t length) {
      const PartFile::Landed landed = cx_.part.Land(offset, length);
      const uint64_t now = cx_.clock.NowUs();
      if (landed.fresh) landed_us_ = now;
      uint64_t none = 0;
      log_.first_landed_us.compare_exchange_strong(none, now);
      if (landed.complete) {
        std::lock_guard<std::mutex> lock(inbox->mu);
        inbox->landed_all = true;
        inbox->cv.notify_all();
      }
    };
  }

  Result<std::string> Next(uint64_t timeout_ms) {
    std::unique_lock<std::mutex> lock(inbox_->mu);
    inbox_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                        [&] { return inbox_->closed || !inbox_->messages.empty(); });
    if (!inbox_->messages.empty()) {
      std::string m = std::move(inbox_->messages.front());
      inbox_->messages.pop_front();
      return m;
    }
    if (inbox_->closed) return inbox_->why;
    return TERN_ERROR(kTimeout, "server did not answer within ", timeout_ms, " ms");
  }

  const AttemptContext& cx_;
  const FetchOptions& o_;
  AttemptLog& log_;
  // Shared with the connection's handlers, which may outlive the attempt.
  const std::shared_ptr<Inbox> inbox_ = std::make_shared<Inbox>();
  std::atomic<uint64_t> landed_us_{0};  // the last chunk not held before landed
};

}  // namespace

Status RunAttempt(const AttemptContext& cx, AttemptLog& log) { return Attempt(cx, log).Run(); }

}  // namespace tern::xfer
