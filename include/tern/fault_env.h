// A fault-injecting decorator over any Env, seeded and deterministic: the Nth
// write, sync or rename fails with kIo, a failing write may first write a
// seeded prefix of its bytes (a short write, as on a full disk), and writes
// may fail at a seeded rate. For tests of the code above that must leave
// nothing half-written behind (atomic replace, checkpoint commit).
//
// What counts: a "write" is WritableFile::Append, CreateMapped (allocating a
// file's blocks) and CopyFile; a "sync" is WritableFile::Sync,
// MappedFile::Sync and SyncPath; a "rename" is Rename in any mode. Counting
// starts at 1 and covers every file opened through this Env.
//
// Thread safety: as env.h. The target Env must outlive this one and the
// files it opened.
#pragma once

#include <cstdint>
#include <memory>

#include "tern/env.h"
#include "tern/export.h"

namespace tern {

struct EnvFaultPolicy {
  uint64_t seed = 1;
  // The Nth operation of each kind fails with kIo; 0 = never.
  uint64_t fail_write_nth = 0;
  uint64_t fail_sync_nth = 0;
  uint64_t fail_rename_nth = 0;
  // Each write also fails with this probability (0..1), drawn from seed.
  double write_failure_rate = 0;
  // A failing Append first writes a seeded prefix (possibly empty, never
  // all) of its bytes.
  bool short_writes = false;
};

struct EnvFaultStats {
  uint64_t writes = 0, syncs = 0, renames = 0;  // attempted, failed ones included
  uint64_t failed = 0;
};

class TERN_EXPORT FaultEnv : public EnvWrapper {
 public:
  FaultEnv(Env& target, EnvFaultPolicy policy);
  ~FaultEnv() override;

  EnvFaultStats stats() const;

  Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                     CreateMode mode) override;
  Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapMode mode) override;
  Result<std::unique_ptr<MappedFile>> CreateMapped(const std::string& path,
                                                   uint64_t size_bytes) override;
  Status Rename(const std::string& from, const std::string& to, RenameMode mode) override;
  Status SyncPath(const std::string& path) override;
  Status CopyFile(const std::string& from, const std::string& to) override;

  struct State;  // shared with the files this Env opened

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tern
