// DefaultEnv(): the POSIX file system (Linux) and SteadyClock().
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "tern/env.h"

namespace tern {
namespace {

static_assert(sizeof(size_t) == 8, "tern needs a 64-bit address space for mappings");

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

Status OpenError(const char* what, const std::string& path) {
  if (errno == ENOENT) return TERN_ERROR(kNotFound, path, ": no such file or directory");
  if (errno == EEXIST) return TERN_ERROR(kAlreadyExists, path, " exists");
  return TERN_ERRNO(what, " ", path);
}

Status PwriteAll(int fd, const uint8_t* data, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd, data, std::min<uint64_t>(size, uint64_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return TERN_ERRNO("write ", path);
    }
    data += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// Copies [offset, end) between two files, by copy_file_range or, where the
// kernel refuses (cross-device, old kernels, special files), pread/pwrite.
Status CopyRange(int in, int out, uint64_t offset, uint64_t end, const std::string& from) {
  bool use_cfr = true;
  std::vector<uint8_t> buffer;
  while (offset < end) {
    const uint64_t want = std::min<uint64_t>(end - offset, uint64_t{1} << 30);
    if (use_cfr) {
      loff_t in_off = static_cast<loff_t>(offset), out_off = static_cast<loff_t>(offset);
      ssize_t n = ::copy_file_range(in, &in_off, out, &out_off, want, 0);
      if (n > 0) {
        offset += static_cast<uint64_t>(n);
        continue;
      }
      if (n == 0) return TERN_ERROR(kIo, "copy ", from, ": file shrank while copying");
      if (errno == EINTR) continue;
      if (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP)
        return TERN_ERRNO("copy_file_range ", from);
      use_cfr = false;
    }
    if (buffer.empty()) buffer.resize(size_t{1} << 20);
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(want, buffer.size()));
    ssize_t n = ::pread(in, buffer.data(), chunk, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return TERN_ERRNO("read ", from);
    if (n == 0) return TERN_ERROR(kIo, "copy ", from, ": file shrank while copying");
    TERN_RETURN_IF_ERROR(PwriteAll(out, buffer.data(), static_cast<uint64_t>(n), offset, from));
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

class PosixReadable final : public ReadableFile {
 public:
  PosixReadable(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Result<uint64_t> Size() const override {
    struct stat st;
    if (::fstat(fd_.get(), &st) != 0) return TERN_ERRNO("stat ", path_);
    return static_cast<uint64_t>(st.st_size);
  }
  Result<uint64_t> ReadAt(uint64_t offset, void* buf, uint64_t size) const override {
    uint64_t done = 0;
    while (done < size) {
      ssize_t n = ::pread(fd_.get(), static_cast<uint8_t*>(buf) + done,
                          std::min<uint64_t>(size - done, uint64_t{1} << 30),
                          static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return TERN_ERRNO("read ", path_);
      if (n == 0) break;
      done += static_cast<uint64_t>(n);
    }
    return done;
  }

 private:
  Fd fd_;
  std::string path_;
};

class PosixWritable final : public WritableFile {
 public:
  PosixWritable(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixWritable() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Append(std::span<const uint8_t> bytes) override {
    TERN_REQUIRE(fd_ >= 0, kInvalidArgument, path_, ": write after close");
    const uint8_t* p = bytes.data();
    uint64_t left = bytes.size();
    while (left > 0) {
      ssize_t n = ::write(fd_, p, std::min<uint64_t>(left, uint64_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return TERN_ERRNO("write ", path_);
      p += n;
      left -= static_cast<uint64_t>(n);
    }
    return Status::Ok();
  }
  Status Sync() override {
    TERN_REQUIRE(fd_ >= 0, kInvalidArgument, path_, ": sync after close");
    if (::fsync(fd_) != 0) return TERN_ERRNO("fsync ", path_);
    return Status::Ok();
  }
  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return TERN_ERRNO("close ", path_);
    return Status::Ok();
  }

 private:
  int fd_;
  std::string path_;
};

class PosixMapped final : public MappedFile {
 public:
  PosixMapped(std::string path, int fd, uint8_t* data, uint64_t size, bool writable)
      : MappedFile(std::move(path), data, size, writable), fd_(fd) {}
  ~PosixMapped() override {
    if (data() != nullptr) ::munmap(data(), size());
  }
  Status Sync() override {
    if (data() != nullptr && writable() && ::msync(data(), size(), MS_SYNC) != 0)
      return TERN_ERRNO("msync ", path());
    if (::fsync(fd_.get()) != 0) return TERN_ERRNO("fsync ", path());
    return Status::Ok();
  }
  // MADV_DONTNEED, not MADV_PAGEOUT or posix_fadvise(POSIX_FADV_DONTNEED):
  // on a MAP_SHARED file mapping it only unmaps the pages from this process
  // (dirty ones stay dirty in the page cache), so nothing is written out now
  // and a reader of the file (the view store applying it) still finds the
  // bytes in the page cache. PAGEOUT would force write-back and evict them;
  // fadvise leaves mapped pages alone.
  Status DropPages(uint64_t offset, uint64_t length) override {
    TERN_REQUIRE(offset <= size() && length <= size() - offset, kInvalidArgument, "DropPages ",
                 path(), ": ", offset, "+", length, " past ", size(), " bytes");
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t first = (offset + page - 1) / page * page;
    const uint64_t end = offset + length == size() ? size() : (offset + length) / page * page;
    if (data() == nullptr || first >= end) return Status::Ok();
    if (::madvise(data() + first, end - first, MADV_DONTNEED) != 0) {
      return TERN_ERRNO("madvise ", path(), " ", first, "+", end - first);
    }
    return Status::Ok();
  }

 private:
  Fd fd_;
};

Result<std::unique_ptr<MappedFile>> MapFd(Fd& fd, const std::string& path, uint64_t size,
                                          bool writable, bool populate) {
  uint8_t* data = nullptr;
  if (size > 0) {  // mmap of length 0 is an error; nothing to map
    const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
    void* p = ::mmap(nullptr, size, prot, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd.get(), 0);
    if (p == MAP_FAILED) return TERN_ERRNO("mmap ", path, " (", size, " bytes)");
    data = static_cast<uint8_t*>(p);
  }
  return std::unique_ptr<MappedFile>(new PosixMapped(path, fd.release(), data, size, writable));
}

class PosixEnv final : public Env {
 public:
  Clock& clock() override { return SteadyClock(); }

  Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) override {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return OpenError("open", path);
    return std::unique_ptr<ReadableFile>(new PosixReadable(fd.release(), path));
  }

  Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                     CreateMode mode) override {
    const int flags =
        O_WRONLY | O_CREAT | O_CLOEXEC | (mode == CreateMode::kTruncate ? O_TRUNC : O_EXCL);
    Fd fd(::open(path.c_str(), flags, mode == CreateMode::kNewOwnerOnly ? 0600 : 0644));
    if (fd.get() < 0) return OpenError("create", path);
    return std::unique_ptr<WritableFile>(new PosixWritable(fd.release(), path));
  }

  Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapMode mode) override {
    const bool writable = mode == MapMode::kReadWrite;
    Fd fd(::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC));
    if (fd.get() < 0) return OpenError("open", path);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return TERN_ERRNO("stat ", path);
    TERN_REQUIRE(S_ISREG(st.st_mode), kInvalidArgument, path, ": not a regular file");
    return MapFd(fd, path, static_cast<uint64_t>(st.st_size), writable,
                 mode == MapMode::kReadOnlyPopulate);
  }

  Result<std::unique_ptr<MappedFile>> CreateMapped(const std::string& path,
                                                   uint64_t size_bytes) override {
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0) return OpenError("create", path);
    if (::ftruncate(fd.get(), static_cast<off_t>(size_bytes)) != 0) {
      Status st = TERN_ERRNO("truncate ", path, " to ", size_bytes, " bytes");
      ::unlink(path.c_str());
      return st;
    }
    // The blocks are allocated now: a store through a shared mapping into a
    // hole the file system cannot fill (disk or tmpfs full) is a SIGBUS, not
    // an error, so a full disk must fail here (the soak's disk_full fault
    // killed a relay in its push path; docs/soak.md). A file system without
    // fallocate keeps the holes, as before.
    if (size_bytes > 0 && ::fallocate(fd.get(), 0, 0, static_cast<off_t>(size_bytes)) != 0 &&
        errno != EOPNOTSUPP) {
      Status st = TERN_ERRNO("allocate ", size_bytes, " bytes for ", path);
      ::unlink(path.c_str());
      return st;
    }
    auto m = MapFd(fd, path, size_bytes, true, false);
    if (!m.ok()) ::unlink(path.c_str());
    return m;
  }

  Result<FileType> TypeOf(const std::string& path, bool follow_links) override {
    struct stat st;
    if ((follow_links ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return FileType::kMissing;
      return TERN_ERRNO("stat ", path);
    }
    if (S_ISREG(st.st_mode)) return FileType::kRegular;
    if (S_ISDIR(st.st_mode)) return FileType::kDirectory;
    if (S_ISLNK(st.st_mode)) return FileType::kSymlink;
    return FileType::kOther;
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return OpenError("stat", path);
    return static_cast<uint64_t>(st.st_size);
  }

  Result<std::vector<std::string>> ListDir(const std::string& path, uint64_t entries_max) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return OpenError("list", path);
    std::vector<std::string> names;
    Status st;
    for (;;) {
      errno = 0;
      const dirent* e = ::readdir(dir);
      if (e == nullptr) {
        if (errno != 0) st = TERN_ERRNO("list ", path);
        break;
      }
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      if (names.size() >= entries_max) {
        st = TERN_ERROR(kResourceExhausted, path, ": more than ", entries_max, " entries");
        break;
      }
      names.push_back(name);
    }
    ::closedir(dir);
    TERN_RETURN_IF_ERROR(st);
    std::sort(names.begin(), names.end());
    return names;
  }

  Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0) return OpenError("mkdir", path);
    return Status::Ok();
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return OpenError("remove", path);
    return Status::Ok();
  }

  Status RemoveDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return OpenError("rmdir", path);
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to, RenameMode mode) override {
    if (mode == RenameMode::kReplace) {
      if (::rename(from.c_str(), to.c_str()) != 0) return RenameError(from, to);
      return Status::Ok();
    }
    const unsigned flags = mode == RenameMode::kNoReplace ? RENAME_NOREPLACE : RENAME_EXCHANGE;
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags) == 0) return Status::Ok();
    if (mode == RenameMode::kNoReplace && (errno == EINVAL || errno == ENOSYS)) {
      // A file system without RENAME_NOREPLACE: check, then rename (racy,
      // but only against another writer of the same path).
      struct stat st;
      TERN_REQUIRE(::lstat(to.c_str(), &st) != 0, kAlreadyExists, to, " exists");
      if (::rename(from.c_str(), to.c_str()) != 0) return RenameError(from, to);
      return Status::Ok();
    }
    return RenameError(from, to);
  }

  Status SyncPath(const std::string& path) override {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return OpenError("open", path);
    if (::fsync(fd.get()) != 0) return TERN_ERRNO("fsync ", path);
    return Status::Ok();
  }

  Status CopyFile(const std::string& from, const std::string& to) override {
    Fd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
    if (in.get() < 0) return OpenError("open", from);
    struct stat st;
    if (::fstat(in.get(), &st) != 0) return TERN_ERRNO("stat ", from);
    TERN_REQUIRE(S_ISREG(st.st_mode), kInvalidArgument, from, ": not a regular file");
    Fd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 0777));
    if (out.get() < 0) return OpenError("create", to);
    Status s = CopyHoles(in.get(), out.get(), static_cast<uint64_t>(st.st_size), from, to);
    if (!s.ok()) ::unlink(to.c_str());
    return s;
  }

  Status CreateSymlink(const std::string& target, const std::string& path) override {
    if (::symlink(target.c_str(), path.c_str()) == 0) return Status::Ok();
    if (errno == EEXIST) return TERN_ERROR(kAlreadyExists, path, " exists");
    if (errno == ENOENT) return TERN_ERROR(kNotFound, path, ": no such directory");
    return TERN_ERRNO("symlink ", path, " -> ", target);
  }

 private:
  static Status RenameError(const std::string& from, const std::string& to) {
    if (errno == EEXIST || errno == ENOTEMPTY) return TERN_ERROR(kAlreadyExists, to, " exists");
    if (errno == ENOENT) return TERN_ERROR(kNotFound, "rename ", from, " to ", to, ": no such file");
    return TERN_ERRNO("rename ", from, " to ", to);
  }

  // Copies the data extents only (SEEK_DATA/SEEK_HOLE), so sparse files stay sparse.
  static Status CopyHoles(int in, int out, uint64_t size, const std::string& from,
                          const std::string& to) {
    if (::ftruncate(out, static_cast<off_t>(size)) != 0) return TERN_ERRNO("truncate ", to);
    uint64_t offset = 0;
    while (offset < size) {
      off_t data = ::lseek(in, static_cast<off_t>(offset), SEEK_DATA);
      if (data < 0) {
        if (errno == ENXIO) break;  // only a hole remains
        if (errno != EINVAL) return TERN_ERRNO("seek ", from);
        data = static_cast<off_t>(offset);  // no SEEK_DATA here: copy everything
      }
      off_t hole = ::lseek(in, data, SEEK_HOLE);
      if (hole < 0) hole = static_cast<off_t>(size);
      const uint64_t end = std::min<uint64_t>(static_cast<uint64_t>(hole), size);
      if (static_cast<uint64_t>(data) >= end) break;
      TERN_RETURN_IF_ERROR(CopyRange(in, out, static_cast<uint64_t>(data), end, from));
      offset = end;
    }
    return Status::Ok();
  }
};

}  // namespace

Env& DefaultEnv() {
  static PosixEnv env;
  return env;
}

}  // namespace tern
