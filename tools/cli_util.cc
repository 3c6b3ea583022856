#include "tools/cli_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

namespace tern::cli {

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return TERN_ERRNO("open ", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = TERN_ERRNO("stat ", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return TERN_ERROR(kInvalidArgument, path, " is not a regular file");
  }
  std::unique_ptr<MappedFile> file(new MappedFile());
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      Status s = TERN_ERRNO("mmap ", path);
      ::close(fd);
      return s;
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Status WriteFileAtomic(const std::string& path, std::span<const uint8_t> bytes, bool overwrite) {
  struct stat st;
  if (!overwrite && ::stat(path.c_str(), &st) == 0)
    return TERN_ERROR(kAlreadyExists, path, " exists (use --force to replace it)");
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return TERN_ERRNO("create ", tmp);
  uint64_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, std::min<uint64_t>(bytes.size() - done, 1 << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status s = TERN_ERRNO("write ", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<uint64_t>(n);
  }
  if (::fsync(fd) != 0) {
    Status s = TERN_ERRNO("fsync ", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (!overwrite && ::stat(path.c_str(), &st) == 0) {  // raced with another writer
    ::unlink(tmp.c_str());
    return TERN_ERROR(kAlreadyExists, path, " exists (use --force to replace it)");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = TERN_ERRNO("rename ", tmp, " to ", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return Status::Ok();
}

CLI::Option* AddOutputFlag(CLI::App& cmd, std::string& path, const std::string& help) {
  return cmd.add_option("-o,--out", path, help)->type_name("PATH")->required();
}

CLI::Option* AddForceFlag(CLI::App& cmd, bool& force, const std::string& help) {
  return cmd.add_flag("--force", force, help);
}

CLI::Option* AddThreadsFlag(CLI::App& cmd, unsigned& threads) {
  return AddUnsigned(cmd, "--threads", threads, "worker threads (0: one per core)", "0", 1024);
}

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace tern::cli
