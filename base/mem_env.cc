// NewMemEnv(): a file system in memory. Files are inodes shared by the names
// and the open handles that refer to them, as on POSIX: a removed or renamed
// file stays readable through a handle opened before. Every name and size
// change happens under one lock; the bytes of a mapping are the caller's to
// synchronise, as with mmap.
//
// Differences from POSIX, all refusals rather than silent divergence: a file
// cannot grow or be truncated while it is mapped (mappings point into its
// buffer), there are no symlinks, and sync is a no-op (nothing is volatile).
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "tern/env.h"

namespace tern {
namespace {

struct Inode {
  std::vector<uint8_t> bytes;
  uint64_t maps = 0;  // live MappedFiles pointing into bytes
};

struct Node {
  FileType type = FileType::kRegular;
  std::shared_ptr<Inode> inode;  // null for a directory
};

// Shared by the Env and every handle it gave out, so handles may outlive it.
struct Fs {
  std::mutex mu;
  std::map<std::string, Node> nodes;  // by normalized absolute path
};

// "/a//b/./c/" -> "/a/b/c"; ".." is resolved lexically.
Result<std::string> Normalize(const std::string& path) {
  TERN_REQUIRE(!path.empty(), kInvalidArgument, "empty path");
  TERN_REQUIRE(path.find('\0') == std::string::npos, kInvalidArgument, "path with a NUL byte");
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    const std::string part = path.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = j + 1;
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? std::string("/") : out;
}

std::string Parent(const std::string& norm) {
  const size_t slash = norm.rfind('/');
  return slash == 0 ? std::string("/") : norm.substr(0, slash);
}

// Whether `path` is `dir` or lies below it.
bool Within(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

class MemReadable final : public ReadableFile {
 public:
  MemReadable(std::shared_ptr<Fs> fs, std::shared_ptr<Inode> inode)
      : fs_(std::move(fs)), inode_(std::move(inode)) {}
  Result<uint64_t> Size() const override {
    std::lock_guard<std::mutex> lock(fs_->mu);
    return inode_->bytes.size();
  }
  Result<uint64_t> ReadAt(uint64_t offset, void* buf, uint64_t size) const override {
    std::lock_guard<std::mutex> lock(fs_->mu);
    const uint64_t have = inode_->bytes.size();
    if (offset >= have) return uint64_t{0};
    const uint64_t n = std::min(size, have - offset);
    std::memcpy(buf, inode_->bytes.data() + offset, n);
    return n;
  }

 private:
  std::shared_ptr<Fs> fs_;
  std::shared_ptr<Inode> inode_;
};

class MemWritable final : public WritableFile {
 public:
  MemWritable(std::shared_ptr<Fs> fs, std::shared_ptr<Inode> inode, std::string path)
      : fs_(std::move(fs)), inode_(std::move(inode)), path_(std::move(path)) {}
  Status Append(std::span<const uint8_t> bytes) override {
    TERN_REQUIRE(!closed_, kInvalidArgument, path_, ": write after close");
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_REQUIRE(inode_->maps == 0 || bytes.empty(), kUnsupported, path_,
                 ": memenv cannot grow a mapped file");
    inode_->bytes.insert(inode_->bytes.end(), bytes.begin(), bytes.end());
    return Status::Ok();
  }
  Status Sync() override {
    TERN_REQUIRE(!closed_, kInvalidArgument, path_, ": sync after close");
    return Status::Ok();
  }
  Status Close() override {
    closed_ = true;
    return Status::Ok();
  }

 private:
  std::shared_ptr<Fs> fs_;
  std::shared_ptr<Inode> inode_;
  std::string path_;
  bool closed_ = false;
};

class MemMapped final : public MappedFile {
 public:
  MemMapped(std::shared_ptr<Fs> fs, std::shared_ptr<Inode> inode, std::string path, bool writable)
      : MappedFile(std::move(path), inode->bytes.empty() ? nullptr : inode->bytes.data(),
                   inode->bytes.size(), writable),
        fs_(std::move(fs)),
        inode_(std::move(inode)) {}  // the caller counted this map in inode->maps
  ~MemMapped() override {
    std::lock_guard<std::mutex> lock(fs_->mu);
    --inode_->maps;
  }
  Status Sync() override { return Status::Ok(); }
  // The inode's buffer is the file: no other copy the pages could go back to.
  Status DropPages(uint64_t offset, uint64_t length) override {
    TERN_REQUIRE(offset <= size() && length <= size() - offset, kInvalidArgument, "DropPages ",
                 path(), ": ", offset, "+", length, " past ", size(), " bytes");
    return Status::Ok();
  }

 private:
  std::shared_ptr<Fs> fs_;
  std::shared_ptr<Inode> inode_;
};

class MemEnv final : public Env {
 public:
  explicit MemEnv(Clock& clock) : clock_(clock), fs_(std::make_shared<Fs>()) {
    fs_->nodes["/"] = Node{FileType::kDirectory, nullptr};
  }

  Clock& clock() override { return clock_; }

  Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_ASSIGN_OR_RETURN(Node * node, FindLocked(p, path));
    TERN_REQUIRE(node->type == FileType::kRegular, kInvalidArgument, path, ": not a regular file");
    return std::unique_ptr<ReadableFile>(new MemReadable(fs_, node->inode));
  }

  Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                     CreateMode mode) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    auto it = fs_->nodes.find(p);
    if (it != fs_->nodes.end()) {
      TERN_REQUIRE(mode == CreateMode::kTruncate, kAlreadyExists, path, " exists");
      TERN_REQUIRE(it->second.type == FileType::kRegular, kIo, "create ", path, ": is a directory");
      TERN_REQUIRE(it->second.inode->maps == 0, kUnsupported, path,
                   ": memenv cannot truncate a mapped file");
      it->second.inode->bytes.clear();
      return std::unique_ptr<WritableFile>(new MemWritable(fs_, it->second.inode, path));
    }
    TERN_ASSIGN_OR_RETURN(Node * node, AddFileLocked(p, path));
    return std::unique_ptr<WritableFile>(new MemWritable(fs_, node->inode, path));
  }

  Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapMode mode) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_ASSIGN_OR_RETURN(Node * node, FindLocked(p, path));
    TERN_REQUIRE(node->type == FileType::kRegular, kInvalidArgument, path, ": not a regular file");
    ++node->inode->maps;
    return std::unique_ptr<MappedFile>(
        new MemMapped(fs_, node->inode, path, mode == MapMode::kReadWrite));
  }

  Result<std::unique_ptr<MappedFile>> CreateMapped(const std::string& path,
                                                   uint64_t size_bytes) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_REQUIRE(!fs_->nodes.contains(p), kAlreadyExists, path, " exists");
    // Bound what a caller can ask of memory: the MemEnv is for tests and
    // small simulations, not for 100 GB checkpoints.
    TERN_REQUIRE(size_bytes <= (uint64_t{1} << 34), kResourceExhausted, path, ": ", size_bytes,
                 " bytes is more than the memenv allows for one file");
    TERN_ASSIGN_OR_RETURN(Node * node, AddFileLocked(p, path));
    node->inode->bytes.assign(static_cast<size_t>(size_bytes), 0);
    ++node->inode->maps;
    return std::unique_ptr<MappedFile>(new MemMapped(fs_, node->inode, path, true));
  }

  Result<FileType> TypeOf(const std::string& path, bool) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    auto it = fs_->nodes.find(p);
    return it == fs_->nodes.end() ? FileType::kMissing : it->second.type;
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_ASSIGN_OR_RETURN(Node * node, FindLocked(p, path));
    return node->inode ? node->inode->bytes.size() : uint64_t{0};
  }

  Result<std::vector<std::string>> ListDir(const std::string& path, uint64_t entries_max) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_ASSIGN_OR_RETURN(Node * node, FindLocked(p, path));
    TERN_REQUIRE(node->type == FileType::kDirectory, kIo, "list ", path, ": not a directory");
    const std::string prefix = p == "/" ? p : p + "/";
    std::vector<std::string> names;
    for (auto it = fs_->nodes.upper_bound(prefix); it != fs_->nodes.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      const std::string rest = it->first.substr(prefix.size());
      if (rest.find('/') != std::string::npos) continue;  // deeper
      TERN_REQUIRE(names.size() < entries_max, kResourceExhausted, path, ": more than ",
                   entries_max, " entries");
      names.push_back(rest);
    }
    return names;  // std::map order is sorted order
  }

  Status CreateDir(const std::string& path) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_REQUIRE(!fs_->nodes.contains(p), kAlreadyExists, path, " exists");
    TERN_RETURN_IF_ERROR(ParentIsDirLocked(p, path));
    fs_->nodes[p] = Node{FileType::kDirectory, nullptr};
    return Status::Ok();
  }

  Status RemoveFile(const std::string& path) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_ASSIGN_OR_RETURN(Node * node, FindLocked(p, path));
    TERN_REQUIRE(node->type != FileType::kDirectory, kIo, "remove ", path, ": is a directory");
    fs_->nodes.erase(p);
    return Status::Ok();
  }

  Status RemoveDir(const std::string& path) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_ASSIGN_OR_RETURN(Node * node, FindLocked(p, path));
    TERN_REQUIRE(node->type == FileType::kDirectory, kIo, "rmdir ", path, ": not a directory");
    TERN_REQUIRE(p != "/", kInvalidArgument, "cannot remove /");
    TERN_REQUIRE(!HasChildrenLocked(p), kIo, "rmdir ", path, ": directory not empty");
    fs_->nodes.erase(p);
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to, RenameMode mode) override {
    TERN_ASSIGN_OR_RETURN(std::string f, Normalize(from));
    TERN_ASSIGN_OR_RETURN(std::string t, Normalize(to));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_ASSIGN_OR_RETURN(Node * src, FindLocked(f, from));
    TERN_RETURN_IF_ERROR(ParentIsDirLocked(t, to));
    TERN_REQUIRE(f != "/" && t != "/", kInvalidArgument, "cannot rename /");
    if (f == t) return Status::Ok();
    TERN_REQUIRE(!Within(t, f) && (mode != RenameMode::kExchange || !Within(f, t)),
                 kInvalidArgument, "rename ", from, " to ", to, ": a directory into itself");
    auto dst = fs_->nodes.find(t);
    const bool src_dir = src->type == FileType::kDirectory;
    if (mode == RenameMode::kExchange) {
      TERN_REQUIRE(dst != fs_->nodes.end(), kNotFound, "exchange ", from, " with ", to,
                   ": no such file");
      auto a = TakeSubtreeLocked(f), b = TakeSubtreeLocked(t);
      PutSubtreeLocked(std::move(a), f, t);
      PutSubtreeLocked(std::move(b), t, f);
      return Status::Ok();
    }
    if (dst != fs_->nodes.end()) {
      TERN_REQUIRE(mode == RenameMode::kReplace, kAlreadyExists, to, " exists");
      const bool dst_dir = dst->second.type == FileType::kDirectory;
      TERN_REQUIRE(src_dir == dst_dir, kIo, "rename ", from, " to ", to,
                   dst_dir ? ": is a directory" : ": not a directory");
      if (dst_dir) {
        TERN_REQUIRE(!HasChildrenLocked(t), kAlreadyExists, to,
                     " exists (a directory that is not empty)");
      }
      fs_->nodes.erase(dst);
    }
    PutSubtreeLocked(TakeSubtreeLocked(f), f, t);
    return Status::Ok();
  }

  Status SyncPath(const std::string& path) override {
    TERN_ASSIGN_OR_RETURN(std::string p, Normalize(path));
    std::lock_guard<std::mutex> lock(fs_->mu);
    return FindLocked(p, path).status();
  }

  Status CopyFile(const std::string& from, const std::string& to) override {
    TERN_ASSIGN_OR_RETURN(std::string f, Normalize(from));
    TERN_ASSIGN_OR_RETURN(std::string t, Normalize(to));
    std::lock_guard<std::mutex> lock(fs_->mu);
    TERN_ASSIGN_OR_RETURN(Node * src, FindLocked(f, from));
    TERN_REQUIRE(src->type == FileType::kRegular, kInvalidArgument, from, ": not a regular file");
    const std::shared_ptr<Inode> source = src->inode;  // AddFileLocked may move nodes
    TERN_REQUIRE(!fs_->nodes.contains(t), kAlreadyExists, to, " exists");
    TERN_ASSIGN_OR_RETURN(Node * dst, AddFileLocked(t, to));
    dst->inode->bytes = source->bytes;
    return Status::Ok();
  }

  Status CreateSymlink(const std::string& target, const std::string& path) override {
    return TERN_ERROR(kUnsupported, "symlink ", path, " -> ", target, ": the in-memory Env has no links");
  }

 private:
  Result<Node*> FindLocked(const std::string& norm, const std::string& path) {
    auto it = fs_->nodes.find(norm);
    TERN_REQUIRE(it != fs_->nodes.end(), kNotFound, path, ": no such file or directory");
    return &it->second;
  }

  Status ParentIsDirLocked(const std::string& norm, const std::string& path) {
    auto it = fs_->nodes.find(Parent(norm));
    TERN_REQUIRE(it != fs_->nodes.end(), kNotFound, path, ": no such file or directory");
    TERN_REQUIRE(it->second.type == FileType::kDirectory, kIo, path, ": not a directory");
    return Status::Ok();
  }

  Result<Node*> AddFileLocked(const std::string& norm, const std::string& path) {
    TERN_RETURN_IF_ERROR(ParentIsDirLocked(norm, path));
    Node& node = fs_->nodes[norm];
    node = Node{FileType::kRegular, std::make_shared<Inode>()};
    return &node;
  }

  // Removes `root` and everything below it, keyed by their path below root.
  std::vector<std::pair<std::string, Node>> TakeSubtreeLocked(const std::string& root) {
    std::vector<std::pair<std::string, Node>> out;
    auto self = fs_->nodes.find(root);
    out.emplace_back("", std::move(self->second));
    fs_->nodes.erase(self);
    // Below root: the names starting with root + "/", contiguous in the map
    // ("/a-x" sorts between "/a" and "/a/b", hence not from root itself).
    const std::string prefix = root + "/";
    auto it = fs_->nodes.lower_bound(prefix);
    while (it != fs_->nodes.end() && it->first.compare(0, prefix.size(), prefix) == 0) {
      out.emplace_back(it->first.substr(root.size()), std::move(it->second));
      it = fs_->nodes.erase(it);
    }
    return out;
  }

  bool HasChildrenLocked(const std::string& dir) {
    const std::string prefix = dir == "/" ? dir : dir + "/";
    auto it = fs_->nodes.upper_bound(prefix);
    return it != fs_->nodes.end() && it->first.compare(0, prefix.size(), prefix) == 0;
  }

  // Puts a subtree taken from `from` back at `to` (also used for exchange).
  void PutSubtreeLocked(std::vector<std::pair<std::string, Node>> subtree, const std::string&,
                        const std::string& to) {
    for (auto& [rest, node] : subtree) fs_->nodes[to + rest] = std::move(node);
  }

  Clock& clock_;
  std::shared_ptr<Fs> fs_;
};

}  // namespace

std::unique_ptr<Env> NewMemEnv(Clock& clock) { return std::make_unique<MemEnv>(clock); }

}  // namespace tern
