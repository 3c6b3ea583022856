// The file server behind `tern xfer serve` (tern/xfer.h): listens, admits
// up to max_sessions clients (a busy one is told so and closed) and runs one
// Session per client. The parts: Sandbox (names -> paths), ServedFile
// (open, map, identify), HashCache and HashFd (whole-file digests),
// HeadSend (the head window's chunks), Session (the protocol).
#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "base/log.h"
#include "base/thread_tracker.h"
#include "tern/xfer.h"
#include "xfer/server/hash_cache.h"
#include "xfer/server/sandbox.h"
#include "xfer/server/session.h"
#include "xfer/xfer_wire.h"

namespace tern {

namespace {

class Server final : public FileServer {
 public:
  Server(Transport& transport, xfer::Sandbox sandbox, FileServerOptions options, Clock& clock)
      : transport_(transport), sandbox_(std::move(sandbox)), options_(std::move(options)), clock_(clock),
        hashes_(xfer::HashCache::Options{options_.hash_threads, options_.max_sessions,
                                         options_.hash_cache_settle_ms * 1000000, options_.on_hash_start,
                                         options_.log}) {}

  ~Server() override {
    hashes_.Stop();
    if (listener_) listener_->Close();
    std::vector<std::shared_ptr<xfer::Session>> sessions;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (auto& w : sessions_) {
        if (auto s = w.lock()) sessions.push_back(s);
      }
    }
    for (auto& s : sessions) s->Close();
    threads_.WaitAll();  // sessions and head sends; hashers go with hashes_
  }

  std::string address() const override { return listener_->address(); }

  Status Listen(const std::string& address) {
    TERN_ASSIGN_OR_RETURN(listener_, transport_.Listen(address, [this](std::shared_ptr<Connection> c) {
      return Accept(std::move(c));
    }));
    return Status::Ok();
  }

 private:
  ConnectionHandlers Accept(std::shared_ptr<Connection> conn) {
    auto s = std::make_shared<xfer::Session>(
        xfer::Session::Context{transport_, sandbox_, hashes_, options_, clock_, threads_}, conn);
    bool refuse = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      sessions_.erase(std::remove_if(sessions_.begin(), sessions_.end(), [](auto& w) { return w.expired(); }),
                      sessions_.end());
      refuse = stopping_ || sessions_.size() >= options_.max_sessions;
      if (!refuse) sessions_.push_back(s);
    }
    if (refuse) return RefuseBusy(std::move(conn));
    ConnectionHandlers h = s->Handlers();
    threads_.Spawn([s] { s->Run(); });
    return h;
  }

  // ERROR "server busy", then Close once it went out: the completion (run on
  // a transport thread) only calls Close, thread-safe and never blocking on
  // this server's locks. A backend that cannot send yet from inside the
  // accept handler fails that send; then the client's first request is
  // answered instead (once).
  ConnectionHandlers RefuseBusy(std::shared_ptr<Connection> conn) {
    LogLine(options_.log, "xfer: refusing " + conn->peer_address() + ": too many sessions");
    auto answered = std::make_shared<std::atomic<bool>>(true);
    auto busy = [] { return xfer::EncodeStatus(xfer::kError, TERN_ERROR(kResourceExhausted, "server busy")); };
    ConnectionHandlers h;
    std::weak_ptr<Connection> wc = conn;
    h.on_message = [wc, answered, busy](std::string) {
      auto c = wc.lock();
      if (!c || answered->exchange(true)) return;
      c->SendMessage(busy(), [c](Status) { c->Close(); });
    };
    conn->SendMessage(busy(), [conn, answered](Status st) {
      if (st.ok()) {
        conn->Close();
      } else {
        answered->store(false);
      }
    });
    return h;
  }

  Transport& transport_;
  const xfer::Sandbox sandbox_;
  const FileServerOptions options_;
  Clock& clock_;
  xfer::HashCache hashes_;  // after what its hashers use, before the sessions' threads
  std::unique_ptr<Listener> listener_;
  std::mutex mu_;  // guards stopping_ and sessions_
  bool stopping_ = false;
  std::vector<std::weak_ptr<xfer::Session>> sessions_;
  ThreadTracker threads_;  // last member: joined before the rest is destroyed
};

}  // namespace

Result<std::unique_ptr<FileServer>> FileServer::Start(Transport& transport, const std::string& listen_address,
                                                      const std::string& root, FileServerOptions options,
                                                      Clock& clock) {
  TERN_ASSIGN_OR_RETURN(xfer::Sandbox sandbox, xfer::Sandbox::Open(root));
  auto server = std::make_unique<Server>(transport, std::move(sandbox), std::move(options), clock);
  TERN_RETURN_IF_ERROR(server->Listen(listen_address));
  return std::unique_ptr<FileServer>(std::move(server));
}

}  // namespace tern
