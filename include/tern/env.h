// Env: the operating system as tern's libraries see it — a clock with sleep
// and a file system — handed to constructors so that tests run the real code
// on a FakeClock, an in-memory file system or a fault-injecting one.
// (Modelled on leveldb's Env, EnvWrapper and NewMemEnv.)
//
//  * DefaultEnv(): POSIX files and SteadyClock(). Linux (copy_file_range,
//    SEEK_DATA, renameat2). Stateless, so sharing it is no hidden dependency.
//  * NewMemEnv(clock): a whole file system in memory; shipped code, not a mock.
//  * EnvWrapper: forwards everything to a target Env; decorators (FaultEnv in
//    tern/fault_env.h) override what they change.
//
// Paths are plain strings; the MemEnv treats relative paths as relative to
// "/". Errors: kNotFound for a missing path, kAlreadyExists for a refused
// overwrite, kIo (with errno text) for everything the OS refused.
//
// Thread safety: every Env method may be called from any thread at once. A
// file object is used by one thread at a time; a MappedFile's bytes follow
// the caller's own synchronisation.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tern/clock.h"
#include "tern/export.h"
#include "tern/status.h"

namespace tern {

// Random-access reads of an open file.
class TERN_EXPORT ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual Result<uint64_t> Size() const = 0;
  // Reads up to `size` bytes at `offset` into buf; fewer only at end of file
  // (0 at or past it).
  virtual Result<uint64_t> ReadAt(uint64_t offset, void* buf, uint64_t size) const = 0;
};

// Sequential writes of a new or truncated file.
class TERN_EXPORT WritableFile {
 public:
  virtual ~WritableFile() = default;  // closes without reporting errors
  // Appends all bytes or fails; after a failure a prefix may have been
  // written (a short write), and the file should be discarded.
  virtual Status Append(std::span<const uint8_t> bytes) = 0;
  // The bytes appended so far are durable (fsync).
  virtual Status Sync() = 0;
  virtual Status Close() = 0;  // idempotent
};

// A whole file mapped into memory: tern's one mapped-file type. Read-only
// mappings must not be written through. Unmaps (and closes) on destruction.
class TERN_EXPORT MappedFile {
 public:
  virtual ~MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_bytes_; }
  std::span<const uint8_t> bytes() const { return {data_, static_cast<size_t>(size_bytes_)}; }
  const std::string& path() const { return path_; }
  bool writable() const { return writable_; }
  // The bytes written through the mapping are durable (msync + fsync).
  virtual Status Sync() = 0;
  // Takes the whole pages inside [offset, offset + length) out of this
  // process's resident set (a partial page at either end stays, unless the
  // range ends at size()). The bytes stay the file's: pages written through
  // a read-write (MAP_SHARED) mapping stay dirty in the page cache and the
  // kernel writes them back; the next touch faults them in again, from the
  // page cache or the file. Not a durability point (that is Sync). It is a
  // hint about memory only, so callers may ignore its errors; the caller
  // keeps other threads from touching the range meanwhile only to avoid
  // faulting it straight back. kInvalidArgument past size(). POSIX:
  // madvise(MADV_DONTNEED); in-memory Envs: nothing to give back.
  virtual Status DropPages(uint64_t offset, uint64_t length) = 0;

 protected:
  MappedFile(std::string path, uint8_t* data, uint64_t size_bytes, bool writable)
      : path_(std::move(path)), data_(data), size_bytes_(size_bytes), writable_(writable) {}

 private:
  std::string path_;
  uint8_t* data_;
  uint64_t size_bytes_;
  bool writable_;
};

enum class FileType : uint8_t { kMissing, kRegular, kDirectory, kSymlink, kOther };

enum class CreateMode : uint8_t {
  kNew,       // the file must not exist (kAlreadyExists)
  kTruncate,  // create, or empty an existing file
  // As kNew, and readable and writable by its owner only (0600 on POSIX)
  // from the moment it exists: for secrets such as a private key, which a
  // chmod after the write would leave readable in between.
  kNewOwnerOnly,
};

enum class MapMode : uint8_t {
  kReadOnly,
  kReadOnlyPopulate,  // and fault every page in now (MAP_POPULATE)
  kReadWrite,         // writes reach the file (MAP_SHARED)
};

enum class RenameMode : uint8_t {
  kReplace,    // rename(2): replaces a file or an empty directory at `to`
  kNoReplace,  // kAlreadyExists if `to` exists (atomically where the FS can)
  kExchange,   // swaps two existing paths atomically (both must exist)
};

class TERN_EXPORT Env {
 public:
  virtual ~Env() = default;

  virtual Clock& clock() = 0;

  virtual Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) = 0;
  virtual Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                             CreateMode mode) = 0;
  // Maps an existing regular file whole (an empty file maps to data() == nullptr).
  virtual Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapMode mode) = 0;
  // Creates `path` (must not exist) with size_bytes zero bytes, allocated (fallocate, or holes where the
  // file system has none: a full disk fails here, not as a SIGBUS on a store), and maps it read-write.
  virtual Result<std::unique_ptr<MappedFile>> CreateMapped(const std::string& path,
                                                           uint64_t size_bytes) = 0;

  // kMissing when nothing is there; follow_links decides whether a symlink
  // reports itself or what it points to.
  virtual Result<FileType> TypeOf(const std::string& path, bool follow_links) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  // Names in a directory (no "." or ".."), sorted; at most entries_max
  // (kResourceExhausted beyond).
  virtual Result<std::vector<std::string>> ListDir(const std::string& path,
                                                   uint64_t entries_max) = 0;
  // One level; kAlreadyExists if something is there, kNotFound without a parent.
  virtual Status CreateDir(const std::string& path) = 0;
  // A file or symlink (never follows it); kNotFound if missing.
  virtual Status RemoveFile(const std::string& path) = 0;
  // An empty directory; kNotFound if missing.
  virtual Status RemoveDir(const std::string& path) = 0;
  virtual Status Rename(const std::string& from, const std::string& to, RenameMode mode) = 0;
  // fsync of a file or directory by name (a directory: its entries are durable).
  virtual Status SyncPath(const std::string& path) = 0;
  // Copies a regular file to `to` (must not exist), keeping holes where the
  // file system has them.
  virtual Status CopyFile(const std::string& from, const std::string& to) = 0;
  // Creates a symbolic link at `path` (must not exist: kAlreadyExists) whose
  // text is `target` (not resolved or checked). kUnsupported where the file
  // system has no links (the MemEnv). Atomic replacement of a link: create it
  // under a temporary name, then Rename(kReplace) over the old one.
  virtual Status CreateSymlink(const std::string& target, const std::string& path) = 0;
};

// Forwards every call to target (which must outlive the wrapper).
class TERN_EXPORT EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env& target) : target_(target) {}
  Env& target() const { return target_; }

  Clock& clock() override { return target_.clock(); }
  Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) override {
    return target_.OpenReadable(path);
  }
  Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                     CreateMode mode) override {
    return target_.OpenWritable(path, mode);
  }
  Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapMode mode) override {
    return target_.Map(path, mode);
  }
  Result<std::unique_ptr<MappedFile>> CreateMapped(const std::string& path,
                                                   uint64_t size_bytes) override {
    return target_.CreateMapped(path, size_bytes);
  }
  Result<FileType> TypeOf(const std::string& path, bool follow_links) override {
    return target_.TypeOf(path, follow_links);
  }
  Result<uint64_t> FileSize(const std::string& path) override { return target_.FileSize(path); }
  Result<std::vector<std::string>> ListDir(const std::string& path, uint64_t entries_max) override {
    return target_.ListDir(path, entries_max);
  }
  Status CreateDir(const std::string& path) override { return target_.CreateDir(path); }
  Status RemoveFile(const std::string& path) override { return target_.RemoveFile(path); }
  Status RemoveDir(const std::string& path) override { return target_.RemoveDir(path); }
  Status Rename(const std::string& from, const std::string& to, RenameMode mode) override {
    return target_.Rename(from, to, mode);
  }
  Status SyncPath(const std::string& path) override { return target_.SyncPath(path); }
  Status CopyFile(const std::string& from, const std::string& to) override {
    return target_.CopyFile(from, to);
  }
  Status CreateSymlink(const std::string& target, const std::string& path) override {
    return target_.CreateSymlink(target, path);
  }

 private:
  Env& target_;
};

// POSIX files and SteadyClock().
TERN_EXPORT Env& DefaultEnv();
// An empty in-memory file system holding only "/", timed by `clock` (which
// must outlive it).
TERN_EXPORT std::unique_ptr<Env> NewMemEnv(Clock& clock = SteadyClock());

// ---- Operations built from the calls above, the same on every Env. ----

// Reads a whole regular file; kResourceExhausted if it holds more than size_max bytes.
TERN_EXPORT Status ReadFileToString(Env& env, const std::string& path, uint64_t size_max,
                                    std::string* out);
// Creates `path` (must not exist) holding bytes; not synced (the caller
// syncs what it commits). On error the partial file is removed.
TERN_EXPORT Status WriteNewFile(Env& env, const std::string& path, std::span<const uint8_t> bytes);
// Atomic replace: writes bytes to a fresh temporary name beside `path`,
// fsyncs it, renames it over `path` (kAlreadyExists, untouched, if path
// exists and !overwrite), then fsyncs the directory. At every instant `path`
// holds either its old contents or all of the new ones; on error the
// temporary is removed. `create` is kNew or kNewOwnerOnly (a secret: the
// temporary is created owner-only, so the bytes are never readable by others).
TERN_EXPORT Status WriteFileAtomic(Env& env, const std::string& path,
                                   std::span<const uint8_t> bytes, bool overwrite,
                                   CreateMode create = CreateMode::kNew);
// mkdir -p.
TERN_EXPORT Status CreateDirs(Env& env, const std::string& path);
// Removes a file, symlink or directory tree (never following links out of
// it); a missing path is fine. Bounded: at most 1,000,000 entries, 64 deep.
TERN_EXPORT Status RemoveTree(Env& env, const std::string& path);

}  // namespace tern
