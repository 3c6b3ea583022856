#include "checkpoint/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

namespace tern::fsutil {
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

Status WriteAll(int fd, const uint8_t* data, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
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
    TERN_RETURN_IF_ERROR(WriteAll(out, buffer.data(), static_cast<uint64_t>(n), offset, from));
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

}  // namespace

MappedFile::MappedFile(MappedFile&& other) noexcept
    : fd_(other.fd_), data_(other.data_), size_(other.size_), path_(std::move(other.path_)) {
  other.fd_ = -1;
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = other.fd_;
    data_ = other.data_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

Result<MappedFile> MappedFile::Map(int fd, const std::string& path, uint64_t size, bool writable,
                                   bool populate) {
  MappedFile m;
  m.fd_ = fd;
  m.path_ = path;
  m.size_ = size;
  if (size == 0) return m;  // mmap of length 0 is an error; nothing to map
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = ::mmap(nullptr, size, prot, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) return TERN_ERRNO("mmap ", path, " (", size, " bytes)");
  m.data_ = static_cast<uint8_t*>(p);
  return m;
}

Result<MappedFile> MappedFile::OpenReadOnly(const std::string& path, bool populate) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return TERN_ERROR(kNotFound, path, ": no such file");
    return TERN_ERRNO("open ", path);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return TERN_ERRNO("stat ", path);
  TERN_REQUIRE(S_ISREG(st.st_mode), kInvalidArgument, path, ": not a regular file");
  auto m = Map(fd.get(), path, static_cast<uint64_t>(st.st_size), false, populate);
  if (m.ok()) fd.release();
  return m;
}

Result<MappedFile> MappedFile::OpenReadWrite(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (fd.get() < 0) return TERN_ERRNO("open ", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return TERN_ERRNO("stat ", path);
  auto m = Map(fd.get(), path, static_cast<uint64_t>(st.st_size), true, false);
  if (m.ok()) fd.release();
  return m;
}

Result<MappedFile> MappedFile::Create(const std::string& path, uint64_t size_bytes) {
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    if (errno == EEXIST) return TERN_ERROR(kAlreadyExists, path, " exists");
    return TERN_ERRNO("create ", path);
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(size_bytes)) != 0)
    return TERN_ERRNO("truncate ", path, " to ", size_bytes, " bytes");
  auto m = Map(fd.get(), path, size_bytes, true, false);
  if (m.ok()) fd.release();
  return m;
}

Status MappedFile::Sync() const {
  if (data_ != nullptr && ::msync(data_, size_, MS_SYNC) != 0) return TERN_ERRNO("msync ", path_);
  if (fd_ >= 0 && ::fsync(fd_) != 0) return TERN_ERRNO("fsync ", path_);
  return Status::Ok();
}

Status CopyFile(const std::string& from, const std::string& to) {
  Fd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) return TERN_ERRNO("open ", from);
  struct stat st;
  if (::fstat(in.get(), &st) != 0) return TERN_ERRNO("stat ", from);
  TERN_REQUIRE(S_ISREG(st.st_mode), kInvalidArgument, from, ": not a regular file");
  Fd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 0777));
  if (out.get() < 0) return TERN_ERRNO("create ", to);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (::ftruncate(out.get(), static_cast<off_t>(size)) != 0) return TERN_ERRNO("truncate ", to);
  uint64_t offset = 0;
  while (offset < size) {
    off_t data = ::lseek(in.get(), static_cast<off_t>(offset), SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // only a hole remains
      if (errno != EINVAL) return TERN_ERRNO("seek ", from);
      data = static_cast<off_t>(offset);  // no SEEK_DATA here: copy everything
    }
    off_t hole = ::lseek(in.get(), data, SEEK_HOLE);
    if (hole < 0) hole = static_cast<off_t>(size);
    const uint64_t end = std::min<uint64_t>(static_cast<uint64_t>(hole), size);
    if (static_cast<uint64_t>(data) >= end) break;
    TERN_RETURN_IF_ERROR(CopyRange(in.get(), out.get(), static_cast<uint64_t>(data), end, from));
    offset = end;
  }
  return Status::Ok();
}

Status WriteNewFile(const std::string& path, std::span<const uint8_t> bytes) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    if (errno == EEXIST) return TERN_ERROR(kAlreadyExists, path, " exists");
    return TERN_ERRNO("create ", path);
  }
  return WriteAll(fd.get(), bytes.data(), bytes.size(), 0, path);
}

Status ReadFile(const std::string& path, uint64_t size_max, std::string* out) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return TERN_ERROR(kNotFound, path, ": no such file");
    return TERN_ERRNO("open ", path);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return TERN_ERRNO("stat ", path);
  TERN_REQUIRE(S_ISREG(st.st_mode), kInvalidArgument, path, ": not a regular file");
  TERN_REQUIRE(static_cast<uint64_t>(st.st_size) <= size_max, kCorrupt, path, ": ", st.st_size,
               " bytes is more than the limit of ", size_max);
  out->assign(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out->size()) {
    ssize_t n = ::pread(fd.get(), out->data() + done, out->size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return TERN_ERRNO("read ", path);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  return Status::Ok();
}

Status FsyncPath(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return TERN_ERRNO("open ", path);
  if (::fsync(fd.get()) != 0) return TERN_ERRNO("fsync ", path);
  return Status::Ok();
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string RandomHex() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
    // No entropy source: pid and address still make clashes unlikely, and
    // O_EXCL / mkdir catch the rest.
    v = static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^ reinterpret_cast<uintptr_t>(&v);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[i] = kHex[(v >> (4 * i)) & 0xF];
  return out;
}

bool PlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

std::string ParentDir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace tern::fsutil
