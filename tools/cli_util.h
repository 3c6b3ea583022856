// Helpers shared by the patch subcommands: mapped patch files, atomic file
// writes, the --threads flag, and human-readable sizes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tern/thread_pool.h"
#include "tern/status.h"
#include "tools/flags.h"

namespace tern::cli {

// A read-only mapping of a whole file (patches can be many GB).
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Writes bytes to path + ".tmp-<pid>", fsyncs, and renames over nothing:
// kAlreadyExists if path exists and !overwrite. On error nothing is left.
Status WriteFileAtomic(const std::string& path, std::span<const uint8_t> bytes, bool overwrite);

// Declares --threads on a command; ThreadsFrom reads it (0 = all cores).
void AddThreadsFlag(Flags& flags);
Result<unsigned> ThreadsFrom(const Flags& flags);

// "1.23 GB", "512 B" (decimal units).
std::string HumanBytes(uint64_t bytes);

// Monotonic seconds.
double NowSeconds();

}  // namespace tern::cli
