// The file service behind `tern xfer`: a bulk copier over any Transport
// (like bbcp/gridftp), and the way the transport is measured.
//
// Protocol (messages on one connection; docs/format/xfer.md, xfer version
// 2): GET name -> INFO size + a tag naming the file version (+ the whole-file
// XXH3-64 when the server already knows it; else HASH follows as soon as it
// is computed, while chunks flow). A fresh client then opens a window over
// its partial file and sends WANT; a client resuming the same version opens
// the window before GET and sends its bitmap with it, so the server starts
// sending at once. The server streams the missing chunks (SendChunks) and
// sends DONE; a client that has every chunk and the hash does not wait for
// DONE. A broken connection is retried with backoff and resumes from the
// acknowledged chunks, also across process restarts (a LOCAL.tern-part.state
// file beside the partial LOCAL.tern-part, keeping the version's tag: a
// changed file restarts from zero). The result is renamed to LOCAL only
// after its whole-file checksum matched.
//
// Thread safety: FileServer is thread-safe; FetchFile blocks its caller.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/connect.h"
#include "tern/xfer_chunks.h"
#include "tern/transport.h"

namespace tern {

struct FileServerOptions {
  uint32_t max_sessions = 64;  // concurrent client connections served
  SendOptions send;
  LogFn log;  // null: stderr
  // Threads computing whole-file hashes in the background, and the most
  // whole-file hashes that run at once, session ones included (INFO never
  // waits for one, except for files <= 64 KiB; the digests of up to 1024
  // file versions are kept, keyed by device, inode, size, mtime and ctime,
  // so a re-GET or resume finds it). A job no session waits for is dropped.
  uint32_t hash_threads = 2;
  // A digest is cached (and a small file's sent in INFO) only if the file's
  // mtime and ctime are older than this when hashing begins: a same-size
  // rewrite within one timestamp tick keeps the file's identity, and must
  // not leave a stale digest cached under it ("racy git"). Hashes of newer
  // files still go out with HASH, uncached.
  uint64_t hash_cache_settle_ms = 2000;
  // Called on a hashing thread before it reads a file (path as served); for
  // tests and monitoring. It may block: that file's hash waits for it.
  std::function<void(const std::string& path)> on_hash_start;
  // Non-empty: a GET must carry this token (compared in constant time) or
  // gets ERROR 15 (auth) and no byte of any file. At most 1024 bytes. It
  // crosses the network as the transport carries it: in clear on plain TCP.
  std::string access_token;
};

class FileServer {
 public:
  // Serves `root`: a directory (names are relative paths inside it; paths
  // escaping it, also through symlinks, are refused) or a single file (served
  // under its base name).
  TERN_EXPORT static Result<std::unique_ptr<FileServer>> Start(Transport& transport,
                                                              const std::string& listen_address,
                                                              const std::string& root,
                                                              FileServerOptions options,
                                                              Clock& clock = SteadyClock());
  virtual ~FileServer() = default;
  virtual std::string address() const = 0;
};

struct FetchProgress {
  uint64_t total_bytes = 0;
  uint64_t done_bytes = 0;     // acknowledged, including resumed
  uint64_t resumed_bytes = 0;  // already present when this run started
  double seconds = 0;          // since this run started
};

struct FetchOptions {
  uint64_t chunk_bytes = 4ull << 20;
  uint64_t connect_timeout_ms = 10000;
  uint64_t stall_timeout_ms = 60000;  // no chunk landing for this long: reconnect
  RetryPolicy retry;                  // reconnects after a broken connection
  // Use and keep LOCAL.tern-part.state. A failed fetch keeps its partial
  // copy (at most the file's size) only with resume on and at least one
  // chunk acknowledged; otherwise it removes both files (docs/format/xfer.md,
  // "Partial file").
  bool resume = true;
  // A fresh fetch opens a window over this much of the start of its partial
  // file before it knows the size, so the server sends those chunks with
  // INFO instead of after a WANT round trip (0: off). Rounded down to whole
  // chunks, at least one, at most 1 GiB. SHOULD cover the bandwidth-delay
  // product: the rest starts a round trip later.
  uint64_t head_bytes = 64ull << 20;
  std::function<void(const FetchProgress&)> on_progress;  // about every 250 ms
  // The server's access token, sent with every GET (empty: none).
  std::string access_token;
};

struct FetchResult {
  uint64_t bytes = 0;
  uint64_t resumed_bytes = 0;
  double seconds = 0;
  uint64_t xxh3 = 0;
  uint32_t reconnects = 0;
  // From the start of FetchFile to the first chunk landing in this run (0
  // when none had to move): what connecting and the request exchange cost.
  double first_chunk_seconds = 0;
  std::string link;  // Connection::Describe() of the last connection
};

TERN_EXPORT Result<FetchResult> FetchFile(Transport& transport, const std::string& address,
                                          const std::string& remote_name,
                                          const std::string& local_path, const FetchOptions& options,
                                          Clock& clock = SteadyClock());

// XXH3-64 of a file's bytes (streamed, bounded memory).
TERN_EXPORT Result<uint64_t> HashFile(const std::string& path);

}  // namespace tern
