// The whole-file XXH3-64 of one file version, read with pread into a bounded
// buffer (never through a mapping: a file truncated under a mapping raises
// SIGBUS).
//
// Contract: HashFd reports kChanged when the file is not the version `id`
// names from start to end (its identity changed, or fewer bytes than its
// size could be read), kStopped when `stop` (polled between 16 MiB blocks)
// returned true; only kOk carries a digest. Thread-compatible: no state.
#pragma once

#include <cstdint>
#include <functional>

#include "xfer/server/served_file.h"

namespace tern::xfer {

struct HashOutcome {
  enum End { kOk, kChanged, kStopped } end = kStopped;
  uint64_t xxh3 = 0;  // 0 unless kOk
  // The file's mtime and ctime were more than `settle_ns` before hashing
  // began: a later same-size write within one timestamp tick (which keeps
  // the identity) cannot have gone unseen, so the digest may be cached
  // under the identity ("racy git" rule).
  bool cacheable = false;
};

HashOutcome HashFd(int fd, const Identity& id, const std::function<bool()>& stop, uint64_t settle_ns);

}  // namespace tern::xfer
