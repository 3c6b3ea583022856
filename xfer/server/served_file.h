// One served file, opened for sending: a regular file mapped read-only and
// named by its identity (the version the client's tag and the hash cache
// refer to).
//
// Contract: MapServedFile refuses anything but a regular file and a symbolic
// link as the last component (paths reach it resolved, so a link there was
// swapped in since); it never blocks on a FIFO or device. A ServedFile is
// immutable once made; Unchanged() may be called from any thread.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tern/status.h"

namespace tern::xfer {

// What names one version of a served file. A write through the file system
// changes mtime and ctime (ctime cannot be set back by a user); a
// replacement by rename changes the inode.
struct Identity {
  uint64_t dev = 0, ino = 0, size = 0, mtime_ns = 0, ctime_ns = 0;
  auto operator<=>(const Identity&) const = default;
  static Identity Of(const struct stat& st);
  // The INFO tag: never 0 (0 means "no version" on the wire).
  uint64_t Tag() const;
};

// Opens a regular file for reading (O_NONBLOCK, so a FIFO cannot block the
// caller). With `nofollow` a symbolic link as the last component is refused.
Result<int> OpenRegular(const std::string& path, struct stat* st, bool nofollow);

// A read-only shared mapping of a whole file, for sending its chunks.
// TODO(env): the Env's MappedFile (tern/env.h) replaces this mapping, so
// that fault tests reach it.
struct ServedFile {
  int fd = -1;
  void* base = nullptr;  // null for an empty file
  uint64_t size = 0;
  Identity id;
  ServedFile() = default;
  ServedFile(const ServedFile&) = delete;
  ServedFile& operator=(const ServedFile&) = delete;
  ~ServedFile();
  // Whether the file still is the version that was opened.
  bool Unchanged() const;
};

Result<std::shared_ptr<ServedFile>> MapServedFile(const std::string& path);

}  // namespace tern::xfer
