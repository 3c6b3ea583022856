// Opening and mapping served files (served_file.h).
#include "xfer/server/served_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <xxhash.h>

namespace tern::xfer {

Identity Identity::Of(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
          static_cast<uint64_t>(st.st_size),
          static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000u + st.st_mtim.tv_nsec,
          static_cast<uint64_t>(st.st_ctim.tv_sec) * 1000000000u + st.st_ctim.tv_nsec};
}

uint64_t Identity::Tag() const {
  const uint64_t fields[5] = {dev, ino, size, mtime_ns, ctime_ns};
  const uint64_t tag = XXH3_64bits(fields, sizeof(fields));
  return tag != 0 ? tag : 1;
}

Result<int> OpenRegular(const std::string& path, struct stat* st, bool nofollow) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
  if (fd < 0 && errno == ELOOP) return TERN_ERROR(kInvalidArgument, path, " is a symbolic link");
  if (fd < 0) return TERN_ERRNO("open ", path);
  if (::fstat(fd, st) != 0) {
    Status s = TERN_ERRNO("stat ", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    return TERN_ERROR(kInvalidArgument, path, " is not a regular file");
  }
  return fd;
}

ServedFile::~ServedFile() {
  if (base != nullptr) ::munmap(base, size);
  if (fd >= 0) ::close(fd);
}

bool ServedFile::Unchanged() const {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && Identity::Of(st) == id;
}

Result<std::shared_ptr<ServedFile>> MapServedFile(const std::string& path) {
  auto m = std::make_shared<ServedFile>();
  struct stat st {};
  TERN_ASSIGN_OR_RETURN(m->fd, OpenRegular(path, &st, /*nofollow=*/true));
  m->id = Identity::Of(st);
  m->size = static_cast<uint64_t>(st.st_size);
  if (m->size > 0) {
    m->base = ::mmap(nullptr, m->size, PROT_READ, MAP_SHARED, m->fd, 0);
    if (m->base == MAP_FAILED) {
      m->base = nullptr;
      return TERN_ERRNO("mmap ", path);
    }
    ::madvise(m->base, m->size, MADV_SEQUENTIAL);
  }
  return m;
}

}  // namespace tern::xfer
