// File-system helpers for checkpoint I/O: memory maps, sparse copies,
// durable renames. Linux only (copy_file_range, SEEK_DATA, renameat2).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tern/status.h"

namespace tern::fsutil {

// A whole file mapped MAP_SHARED. Move-only; unmaps and closes on destruction.
class MappedFile {
 public:
  static Result<MappedFile> OpenReadOnly(const std::string& path, bool populate);
  // Opens an existing file for writing (the mapping is PROT_READ|PROT_WRITE).
  static Result<MappedFile> OpenReadWrite(const std::string& path);
  // Creates `path` (must not exist) of size_bytes bytes, all holes.
  static Result<MappedFile> Create(const std::string& path, uint64_t size_bytes);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  ~MappedFile();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, static_cast<size_t>(size_)}; }
  const std::string& path() const { return path_; }
  // msync + fsync: the bytes written through the mapping are durable.
  Status Sync() const;

 private:
  static Result<MappedFile> Map(int fd, const std::string& path, uint64_t size, bool writable,
                                bool populate);
  void Reset();
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

// Copies a regular file to `to` (which must not exist), skipping holes so
// sparse files stay sparse; copy_file_range where the kernel allows it.
Status CopyFile(const std::string& from, const std::string& to);
Status WriteNewFile(const std::string& path, std::span<const uint8_t> bytes);
Status ReadFile(const std::string& path, uint64_t size_max, std::string* out);
Status FsyncPath(const std::string& path);
// Removes a file or a directory tree; missing is fine.
void RemoveTree(const std::string& path);
// 16 random hex digits from getrandom().
std::string RandomHex();
// Plain name: non-empty, no '/', no NUL, not "." or "..".
bool PlainFileName(const std::string& name);
std::string ParentDir(const std::string& path);
std::string BaseName(const std::string& path);

}  // namespace tern::fsutil
