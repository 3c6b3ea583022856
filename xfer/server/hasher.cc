// Whole-file hashing (hasher.h) and the public HashFile (tern/xfer.h).
#include "xfer/server/hasher.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include <xxhash.h>

#include "tern/xfer.h"

namespace tern::xfer {

namespace {

constexpr uint64_t kHashBlockBytes = 16 << 20;

// Wall time, the clock file timestamps are on (not the injected Clock).
uint64_t WallNs() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

HashOutcome HashFd(int fd, const Identity& id, const std::function<bool()>& stop, uint64_t settle_ns) {
  HashOutcome out;
  const uint64_t started = WallNs();
  struct stat st {};
  if (::fstat(fd, &st) != 0 || Identity::Of(st) != id) {
    out.end = HashOutcome::kChanged;
    return out;
  }
  std::unique_ptr<char[]> buf(new char[std::max<uint64_t>(1, std::min(kHashBlockBytes, id.size))]);
  XXH3_state_t* state = XXH3_createState();
  TERN_ASSERT(state != nullptr);
  XXH3_64bits_reset(state);
  uint64_t at = 0;
  out.end = HashOutcome::kOk;
  while (at < id.size) {
    if (stop && stop()) {
      out.end = HashOutcome::kStopped;
      break;
    }
    const ssize_t n = ::pread(fd, buf.get(), std::min(kHashBlockBytes, id.size - at), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // an error or a short file: not the version that was opened
      out.end = HashOutcome::kChanged;
      break;
    }
    XXH3_64bits_update(state, buf.get(), static_cast<size_t>(n));
    at += static_cast<uint64_t>(n);
  }
  if (out.end == HashOutcome::kOk) {
    out.xxh3 = XXH3_64bits_digest(state);
    if (::fstat(fd, &st) != 0 || Identity::Of(st) != id) out.end = HashOutcome::kChanged;
    out.cacheable = id.mtime_ns + settle_ns < started && id.ctime_ns + settle_ns < started;
  }
  XXH3_freeState(state);
  if (out.end != HashOutcome::kOk) out.xxh3 = 0;
  return out;
}

}  // namespace tern::xfer

namespace tern {

Result<uint64_t> HashFile(const std::string& path) {
  struct stat st {};
  TERN_ASSIGN_OR_RETURN(int fd, xfer::OpenRegular(path, &st, /*nofollow=*/false));
  const xfer::HashOutcome h = xfer::HashFd(fd, xfer::Identity::Of(st), nullptr, 0);
  ::close(fd);
  TERN_REQUIRE(h.end == xfer::HashOutcome::kOk, kUnavailable, path, " changed while it was hashed");
  return h.xxh3;
}

}  // namespace tern
