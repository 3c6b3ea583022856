// One client connection of the file server: a bounded inbox filled by the
// transport's handlers, and the session thread that answers the requests in
// order (GET -> INFO [+ head chunks], WANT -> chunks, HASH, DONE; protocol in
// docs/format/xfer.md), so a long send never blocks the transport's threads.
//
// Contract: the server makes a Session, returns Handlers() from its accept
// handler and runs Run() on a thread of its own; Close() (any thread) ends
// Run soon after. A client that sends a message longer than the longest
// legal request, or queues more than kMaxInbox requests or kMaxInboxBytes,
// is disconnected (logged once). Every reply a request gets is one message.
// What the session uses (Context) must outlive Run.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "base/thread_tracker.h"
#include "tern/xfer.h"
#include "xfer/server/hash_cache.h"
#include "xfer/server/head_send.h"
#include "xfer/server/sandbox.h"
#include "xfer/server/served_file.h"
#include "xfer/xfer_wire.h"

namespace tern::xfer {

class Session : public std::enable_shared_from_this<Session> {
 public:
  // A client has at most two requests in flight (GET, then WANT).
  static constexpr size_t kMaxInbox = 16;
  // The longest legal request: a GET with the longest name and the bitmap
  // of kMaxChunks chunks (a WANT is shorter).
  static constexpr size_t kMaxRequestBytes = 1 + 4 + 8 + 8 + 4 + kMaxNameBytes + 8 + 8 + 4 + kMaxChunks / 8 + 8;
  // Two requests of the longest kind.
  static constexpr size_t kMaxInboxBytes = 2 * kMaxRequestBytes;
  // Files this small are hashed before INFO: cheaper than a HASH message.
  static constexpr uint64_t kInlineHashBytes = 64 << 10;

  struct Context {
    Transport& transport;
    const Sandbox& sandbox;
    HashCache& hashes;
    const FileServerOptions& options;
    Clock& clock;
    ThreadTracker& threads;  // for head sends
  };

  Session(Context context, std::shared_ptr<Connection> conn) : cx_(context), conn_(std::move(conn)) {}

  // The connection's handlers: they hold the session weakly.
  ConnectionHandlers Handlers();
  // The session thread: returns when the client or the server closed.
  void Run();
  void Close();

 private:
  // The file the last GET opened.
  struct Served {
    std::shared_ptr<ServedFile> file;
    MemoryRegion region;
    uint64_t chunk_bytes = 0;
    uint64_t transfer_id = 0;  // the GET's: named by INFO and HASH
    uint64_t window_id = 0;    // the client's window the chunks go to (GET's or WANT's)
    bool hash_known = false;   // INFO or HASH carried it
    uint64_t xxh3 = 0;
    std::shared_ptr<HashJob> job;  // a ticket; null when known or self-hashed
    bool awaiting_want = false;
    uint64_t head_chunks = 0;        // chunks sent into the client's head window
    std::shared_ptr<HeadSend> head;  // that send, while it runs
    uint64_t Chunks() const { return file->size / chunk_bytes + (file->size % chunk_bytes != 0); }
  };

  bool Closed();
  // The next request; false once closed.
  bool Next(std::string* msg);
  void Release();
  void OnGet(const std::string& msg);
  void OnWant(const std::string& msg);
  Result<Info> Open(std::string_view msg, std::string* have);
  Status Transfer(std::string_view have);
  void MaybeSendHash();
  Status FinishHash();

  const Context cx_;
  const std::shared_ptr<Connection> conn_;
  std::mutex mu_;  // guards the inbox and closed_
  std::condition_variable cv_;
  std::deque<std::string> inbox_;
  size_t inbox_bytes_ = 0;
  bool closed_ = false;
  std::string refused_;  // why the handler closed the session (logged once)
  Served f_;  // the session thread's only
};

}  // namespace tern::xfer
