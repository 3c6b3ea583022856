#include "tern/fault_env.h"

#include <mutex>
#include <random>

namespace tern {

struct FaultEnv::State {
  explicit State(EnvFaultPolicy p) : policy(p), rng(p.seed) {}

  enum class Kind { kWrite, kSync, kRename };

  // Counts one operation; true if it is to fail. *prefix_bytes (writes only)
  // is how much of a failing write of `size` bytes still reaches the file.
  bool Fail(Kind kind, uint64_t size = 0, uint64_t* prefix_bytes = nullptr) {
    std::lock_guard<std::mutex> lock(mu);
    uint64_t n = 0, nth = 0;
    switch (kind) {
      case Kind::kWrite:
        n = ++stats.writes;
        nth = policy.fail_write_nth;
        break;
      case Kind::kSync:
        n = ++stats.syncs;
        nth = policy.fail_sync_nth;
        break;
      case Kind::kRename:
        n = ++stats.renames;
        nth = policy.fail_rename_nth;
        break;
    }
    bool fail = nth != 0 && n == nth;
    if (kind == Kind::kWrite && policy.write_failure_rate > 0 &&
        std::uniform_real_distribution<double>(0, 1)(rng) < policy.write_failure_rate)
      fail = true;
    if (!fail) return false;
    ++stats.failed;
    if (prefix_bytes != nullptr) {
      *prefix_bytes = policy.short_writes && size > 0
                          ? std::uniform_int_distribution<uint64_t>(0, size - 1)(rng)
                          : 0;
    }
    return true;
  }

  EnvFaultPolicy policy;
  std::mutex mu;
  std::mt19937_64 rng;
  EnvFaultStats stats;
};

namespace {

using Kind = FaultEnv::State::Kind;

class FaultWritable final : public WritableFile {
 public:
  FaultWritable(std::unique_ptr<WritableFile> inner, std::shared_ptr<FaultEnv::State> state,
                std::string path)
      : inner_(std::move(inner)), state_(std::move(state)), path_(std::move(path)) {}
  Status Append(std::span<const uint8_t> bytes) override {
    uint64_t prefix = 0;
    if (state_->Fail(Kind::kWrite, bytes.size(), &prefix)) {
      if (prefix > 0) (void)inner_->Append(bytes.first(static_cast<size_t>(prefix)));
      return TERN_ERROR(kIo, "write ", path_, ": injected fault (", prefix, " of ", bytes.size(),
                        " bytes written)");
    }
    return inner_->Append(bytes);
  }
  Status Sync() override {
    if (state_->Fail(Kind::kSync)) return TERN_ERROR(kIo, "fsync ", path_, ": injected fault");
    return inner_->Sync();
  }
  Status Close() override { return inner_->Close(); }

 private:
  std::unique_ptr<WritableFile> inner_;
  std::shared_ptr<FaultEnv::State> state_;
  std::string path_;
};

class FaultMapped final : public MappedFile {
 public:
  FaultMapped(std::unique_ptr<MappedFile> inner, std::shared_ptr<FaultEnv::State> state)
      : MappedFile(inner->path(), inner->data(), inner->size(), inner->writable()),
        inner_(std::move(inner)),
        state_(std::move(state)) {}
  Status Sync() override {
    if (state_->Fail(Kind::kSync)) return TERN_ERROR(kIo, "fsync ", path(), ": injected fault");
    return inner_->Sync();
  }
  Status DropPages(uint64_t offset, uint64_t length) override {
    return inner_->DropPages(offset, length);
  }

 private:
  std::unique_ptr<MappedFile> inner_;
  std::shared_ptr<FaultEnv::State> state_;
};

}  // namespace

FaultEnv::FaultEnv(Env& target, EnvFaultPolicy policy)
    : EnvWrapper(target), state_(std::make_shared<State>(policy)) {}
FaultEnv::~FaultEnv() = default;

EnvFaultStats FaultEnv::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

Result<std::unique_ptr<WritableFile>> FaultEnv::OpenWritable(const std::string& path,
                                                             CreateMode mode) {
  TERN_ASSIGN_OR_RETURN(auto inner, target().OpenWritable(path, mode));
  return std::unique_ptr<WritableFile>(new FaultWritable(std::move(inner), state_, path));
}

Result<std::unique_ptr<MappedFile>> FaultEnv::Map(const std::string& path, MapMode mode) {
  TERN_ASSIGN_OR_RETURN(auto inner, target().Map(path, mode));
  return std::unique_ptr<MappedFile>(new FaultMapped(std::move(inner), state_));
}

Result<std::unique_ptr<MappedFile>> FaultEnv::CreateMapped(const std::string& path,
                                                           uint64_t size_bytes) {
  if (state_->Fail(Kind::kWrite))
    return TERN_ERROR(kIo, "create ", path, ": injected fault (no space)");
  TERN_ASSIGN_OR_RETURN(auto inner, target().CreateMapped(path, size_bytes));
  return std::unique_ptr<MappedFile>(new FaultMapped(std::move(inner), state_));
}

Status FaultEnv::Rename(const std::string& from, const std::string& to, RenameMode mode) {
  if (state_->Fail(Kind::kRename))
    return TERN_ERROR(kIo, "rename ", from, " to ", to, ": injected fault");
  return target().Rename(from, to, mode);
}

Status FaultEnv::SyncPath(const std::string& path) {
  if (state_->Fail(Kind::kSync)) return TERN_ERROR(kIo, "fsync ", path, ": injected fault");
  return target().SyncPath(path);
}

Status FaultEnv::CopyFile(const std::string& from, const std::string& to) {
  if (state_->Fail(Kind::kWrite))
    return TERN_ERROR(kIo, "copy ", from, " to ", to, ": injected fault");
  return target().CopyFile(from, to);
}

}  // namespace tern
