// The file BoardLog (agent/board/board_log.h; format in docs/agent/board.md §2).
//
// One file per record, "<version:020>-<seq:010>.rec", written by
// WriteFileAtomic (temporary, fsync, no-replace rename, directory fsync), so
// a record is wholly there or absent and the rename is the commit point.
// HEAD is not a file of its own: it is the last record of the chain of
// records flagged advance_head, each of which stores the HEAD it replaced,
// so a missing record in the middle of the chain is caught at open. The
// chain is ordered by position (epoch, version), not by file name: a
// supersede (format 2, docs/agent/board.md §4a) renumbers downwards.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "agent/board/board_log.h"
#include "base/coding.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "base/hash.h"
#include "base/text.h"

namespace tern::agent {
namespace {

constexpr char kRecordMagic[8] = {'T', 'E', 'R', 'N', 'B', 'R', 'E', 'C'};
constexpr char kIdMagic[8] = {'T', 'E', 'R', 'N', 'B', 'I', 'D', '1'};
// Format 1 for epoch 0, byte for byte as before epochs; format 2 (the
// epoch at bytes 12..15, the supersede flag) only from epoch 1 on.
constexpr uint16_t kRecordFormat = 1;
constexpr uint16_t kRecordFormatEpoch = 2;
constexpr uint16_t kFlagAdvanceHead = 1;
constexpr uint16_t kFlagSupersede = 2;  // advance_head into a higher epoch
constexpr size_t kRecordHeaderBytes = 48;
constexpr size_t kIdFileBytes = 8 + 16 + 8;
constexpr const char* kIdFile = "board_id";
constexpr const char* kRecordSuffix = ".rec";
// Directory entries a scan accepts: every record plus temporaries and the id.
constexpr uint64_t kDirEntriesMax = kMaxBoardRecords + 1024;

struct Key {
  uint64_t version;
  uint32_t seq;
  auto operator<=>(const Key&) const = default;
};

struct Decoded {
  Key key;
  uint32_t epoch;
  bool advance_head;
  bool supersede;
  uint64_t expected_head;
  std::string payload;
};

std::string RecordName(Key k) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%020" PRIu64 "-%010" PRIu32 "%s", k.version, k.seq,
                kRecordSuffix);
  return buf;
}

// "<20 digits>-<10 digits>.rec" exactly, or nullopt.
std::optional<Key> ParseRecordName(const std::string& name) {
  if (name.size() != 20 + 1 + 10 + 4 || name.compare(31, 4, kRecordSuffix) != 0 || name[20] != '-')
    return std::nullopt;
  auto v = ParseDecimal(std::string_view(name).substr(0, 20));
  auto s = ParseDecimal(std::string_view(name).substr(21, 10), UINT32_MAX);
  if (!v.ok() || !s.ok()) return std::nullopt;
  return Key{*v, static_cast<uint32_t>(*s)};
}

std::string EncodeRecord(Key k, uint32_t epoch, bool advance_head, bool supersede,
                         uint64_t expected_head, const std::string& payload) {
  std::string out(kRecordHeaderBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(p, kRecordMagic, 8);
  EncodeFixed16(p + 8, epoch == 0 ? kRecordFormat : kRecordFormatEpoch);
  EncodeFixed16(p + 10, (advance_head ? kFlagAdvanceHead : 0) | (supersede ? kFlagSupersede : 0));
  EncodeFixed32(p + 12, epoch);
  EncodeFixed64(p + 16, k.version);
  EncodeFixed32(p + 24, k.seq);
  EncodeFixed32(p + 28, static_cast<uint32_t>(payload.size()));
  EncodeFixed64(p + 32, expected_head);
  out += payload;
  // The checksum covers everything but itself: header bytes 0..40 and the payload.
  std::string covered = out.substr(0, 40) + payload;
  EncodeFixed64(reinterpret_cast<uint8_t*>(out.data()) + 40,
                Xxh3(covered.data(), covered.size()));
  return out;
}

Result<Decoded> DecodeRecord(const std::string& name, Key expect, const std::string& bytes) {
  TERN_REQUIRE(bytes.size() >= kRecordHeaderBytes, kCorrupt, "board record ", name, ": ",
               bytes.size(), " bytes, shorter than its header");
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  TERN_REQUIRE(std::memcmp(p, kRecordMagic, 8) == 0, kCorrupt, "board record ", name,
               ": bad magic");
  const uint16_t format = DecodeFixed16(p + 8);
  TERN_REQUIRE(format == kRecordFormat || format == kRecordFormatEpoch, kCorrupt, "board record ",
               name, ": format ", format, ", expected ", kRecordFormat, " or ", kRecordFormatEpoch);
  const uint16_t flags = DecodeFixed16(p + 10);
  const uint32_t epoch = DecodeFixed32(p + 12);
  if (format == kRecordFormat) {
    TERN_REQUIRE((flags & ~kFlagAdvanceHead) == 0 && epoch == 0, kCorrupt, "board record ", name,
                 ": reserved bits set");
  } else {
    TERN_REQUIRE((flags & ~(kFlagAdvanceHead | kFlagSupersede)) == 0, kCorrupt, "board record ",
                 name, ": reserved bits set");
    TERN_REQUIRE(epoch >= 1, kCorrupt, "board record ", name,
                 ": format 2 with epoch 0 (epoch 0 is format 1)");
    TERN_REQUIRE((flags & kFlagSupersede) == 0 || (flags & kFlagAdvanceHead) != 0, kCorrupt,
                 "board record ", name, ": supersede flag without advance_head");
  }
  const uint32_t length = DecodeFixed32(p + 28);
  TERN_REQUIRE(length >= 1 && length <= kMaxBoardRecordBytes &&
                   bytes.size() == kRecordHeaderBytes + length,
               kCorrupt, "board record ", name, ": length ", length, " does not match its ",
               bytes.size(), " bytes");
  std::string covered = bytes.substr(0, 40) + bytes.substr(kRecordHeaderBytes);
  TERN_REQUIRE(DecodeFixed64(p + 40) == Xxh3(covered.data(), covered.size()), kCorrupt,
               "board record ", name, ": checksum mismatch");
  Decoded d{{DecodeFixed64(p + 16), DecodeFixed32(p + 24)},
            epoch,
            (flags & kFlagAdvanceHead) != 0,
            (flags & kFlagSupersede) != 0,
            DecodeFixed64(p + 32),
            bytes.substr(kRecordHeaderBytes)};
  TERN_REQUIRE(d.key == expect, kCorrupt, "board record ", name, ": holds version ",
               d.key.version, " seq ", d.key.seq);
  TERN_REQUIRE(d.key.version >= 1 && d.key.seq < kMaxManifestsPerVersion, kCorrupt,
               "board record ", name, ": version or seq out of range");
  TERN_REQUIRE(d.advance_head == (d.key.seq == 0), kCorrupt, "board record ", name,
               ": head flag on seq ", d.key.seq);
  // Within an epoch numbers grow; a supersede's replaced HEAD is of the
  // epoch before, which the chain check at open compares.
  TERN_REQUIRE(!d.advance_head || d.supersede || d.expected_head < d.key.version, kCorrupt,
               "board record ", name, ": replaced HEAD ", d.expected_head, " is not older");
  TERN_REQUIRE(!d.supersede || d.expected_head != d.key.version, kCorrupt, "board record ", name,
               ": replaces itself");
  return d;
}

std::string Pos(BoardPos p) {
  return std::to_string(p.version) + " (epoch " + std::to_string(p.epoch) + ")";
}

class FileBoardLog final : public BoardLog {
 public:
  FileBoardLog(Env& env, std::string dir) : env_(env), dir_(std::move(dir)) {}

  // Scans the directory: removes temporaries of interrupted writes, decodes
  // every record, checks the HEAD chain.
  Status Load() {
    MutexLock lock(mu_);
    TERN_ASSIGN_OR_RETURN(auto loaded, Scan(/*clean=*/true));
    keys_.clear();
    for (const auto& d : loaded.records) keys_[d.key] = d.epoch;
    head_ = loaded.head;
    return Status::Ok();
  }

  Result<BoardId> InitId(const BoardId& candidate) override {
    MutexLock lock(mu_);
    const std::string path = dir_ + "/" + kIdFile;
    std::string bytes(kIdFileBytes, '\0');
    auto* p = reinterpret_cast<uint8_t*>(bytes.data());
    std::memcpy(p, kIdMagic, 8);
    std::memcpy(p + 8, candidate.data(), 16);
    EncodeFixed64(p + 24, Xxh3(p, 24));
    Status st = WriteFileAtomic(env_, path, AsBytes(bytes), /*overwrite=*/false);
    if (!st.ok() && st.code() != Code::kAlreadyExists) return st;
    std::string stored;
    TERN_RETURN_IF_ERROR(ReadFileToString(env_, path, 4096, &stored));
    const auto* q = reinterpret_cast<const uint8_t*>(stored.data());
    TERN_REQUIRE(stored.size() == kIdFileBytes && std::memcmp(q, kIdMagic, 8) == 0 &&
                     DecodeFixed64(q + 24) == Xxh3(q, 24),
                 kCorrupt, path, ": not a board id file");
    BoardId id;
    std::memcpy(id.data(), q + 8, 16);
    return id;
  }

  Status Append(BoardPos pos, uint32_t seq, std::string signed_manifest, bool advance_head,
                BoardPos expected_head) override {
    const uint64_t version = pos.version;
    TERN_REQUIRE(version >= 1, kInvalidArgument, "board record: version 0");
    TERN_REQUIRE(seq < kMaxManifestsPerVersion, kInvalidArgument, "board record: seq ", seq,
                 " >= ", kMaxManifestsPerVersion);
    TERN_REQUIRE(!signed_manifest.empty() && signed_manifest.size() <= kMaxBoardRecordBytes,
                 kInvalidArgument, "board record: ", signed_manifest.size(),
                 " bytes, outside 1..", kMaxBoardRecordBytes);
    TERN_REQUIRE(advance_head == (seq == 0), kInvalidArgument,
                 "board record: advance_head must be exactly seq 0 (seq ", seq, ")");
    TERN_REQUIRE(!advance_head || pos > expected_head, kInvalidArgument, "board record: ", Pos(pos),
                 " does not advance HEAD ", Pos(expected_head));
    MutexLock lock(mu_);
    const Key key{version, seq};
    TERN_REQUIRE(!keys_.contains(key), kAlreadyExists, "board record ", version, "/", seq,
                 " exists");
    TERN_REQUIRE(!advance_head || head_ == expected_head, kMismatch, "board HEAD is ", Pos(head_),
                 ", not ", Pos(expected_head));
    if (!advance_head) {
      auto publication = keys_.find(Key{version, 0});
      TERN_REQUIRE(publication == keys_.end() || publication->second == pos.epoch, kInvalidArgument,
                   "board record ", version, "/", seq, ": epoch ", pos.epoch,
                   ", its publication's is ", publication->second);
    }
    TERN_REQUIRE(keys_.size() < kMaxBoardRecords, kResourceExhausted, "board log holds ",
                 keys_.size(), " records");
    const std::string path = dir_ + "/" + RecordName(key);
    const bool supersede = advance_head && pos.epoch > expected_head.epoch;
    const std::string bytes =
        EncodeRecord(key, pos.epoch, advance_head, supersede,
                     advance_head ? expected_head.version : 0, signed_manifest);
    Status st = WriteFileAtomic(env_, path, AsBytes(bytes), /*overwrite=*/false);
    if (!st.ok()) {
      // The rename is the commit: if the file is there, the record is (maybe
      // not yet durably); keep memory in step with what LoadAll would show.
      auto type = env_.TypeOf(path, /*follow_links=*/false);
      if (!type.ok() || *type != FileType::kMissing) Note(key, pos, advance_head);
      return st.WithContext("appending board record");
    }
    Note(key, pos, advance_head);
    return Status::Ok();
  }

  Result<std::vector<BoardRecord>> LoadAll() override {
    MutexLock lock(mu_);
    TERN_ASSIGN_OR_RETURN(auto loaded, Scan(/*clean=*/false));
    std::vector<BoardRecord> out;
    out.reserve(loaded.records.size());
    for (auto& d : loaded.records)
      out.push_back({d.key.version, d.key.seq, std::move(d.payload), d.epoch});
    return out;
  }

  Result<uint64_t> Head() override {
    MutexLock lock(mu_);
    return head_.version;
  }

  Status DropBelow(BoardPos floor) override {
    MutexLock lock(mu_);
    TERN_REQUIRE(floor <= head_, kInvalidArgument, "board: cannot drop below ", Pos(floor),
                 ", past HEAD ", Pos(head_));
    // Ascending by position, so a crash part-way leaves a suffix of the
    // HEAD chain.
    std::vector<std::pair<BoardPos, Key>> below;
    for (const auto& [key, epoch] : keys_)
      if (BoardPos{epoch, key.version} < floor) below.push_back({{epoch, key.version}, key});
    std::sort(below.begin(), below.end(), [](const auto& a, const auto& b) {
      return std::pair(a.first, a.second.seq) < std::pair(b.first, b.second.seq);
    });
    for (const auto& [pos, key] : below) {
      Status st = env_.RemoveFile(dir_ + "/" + RecordName(key));
      if (!st.ok() && st.code() != Code::kNotFound) return st.WithContext("dropping board record");
      keys_.erase(key);
    }
    return env_.SyncPath(dir_);
  }

 private:
  static std::span<const uint8_t> AsBytes(const std::string& s) {
    return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
  }

  void Note(Key key, BoardPos pos, bool advance_head) REQUIRES(mu_) {
    keys_[key] = pos.epoch;
    if (advance_head) head_ = pos;  // the append checked it replaced head_
  }

  struct Scanned {
    std::vector<Decoded> records;  // sorted by key
    BoardPos head;                 // the end of the HEAD chain
  };

  // Every record, sorted by key; the HEAD chain checked.
  // Under mu_: the directory is this object's, scanned as one snapshot.
  Result<Scanned> Scan(bool clean) REQUIRES(mu_) {
    TERN_ASSIGN_OR_RETURN(auto names, env_.ListDir(dir_, kDirEntriesMax));
    std::vector<Decoded> out;
    for (const auto& name : names) {
      if (name.find(".tmp-") != std::string::npos) {
        // An interrupted WriteFileAtomic: never renamed, so never committed.
        if (clean) TERN_RETURN_IF_ERROR(env_.RemoveFile(dir_ + "/" + name));
        continue;
      }
      if (name == kIdFile) continue;
      auto key = ParseRecordName(name);
      TERN_REQUIRE(key.has_value(), kCorrupt, dir_, ": unexpected file ", name,
                   " in the board log");
      TERN_REQUIRE(out.size() < kMaxBoardRecords, kResourceExhausted, dir_, ": more than ",
                   kMaxBoardRecords, " board records");
      std::string bytes;
      Status st = ReadFileToString(env_, dir_ + "/" + name,
                                   kRecordHeaderBytes + kMaxBoardRecordBytes, &bytes);
      if (st.code() == Code::kResourceExhausted)
        return TERN_ERROR(kCorrupt, "board record ", name, ": larger than any record");
      TERN_RETURN_IF_ERROR(st);
      TERN_ASSIGN_OR_RETURN(Decoded d, DecodeRecord(name, *key, bytes));
      out.push_back(std::move(d));
    }
    std::sort(out.begin(), out.end(), [](const Decoded& a, const Decoded& b) { return a.key < b.key; });
    TERN_ASSIGN_OR_RETURN(const BoardPos head, CheckChain(out));
    return Scanned{std::move(out), head};
  }

  // Each publication replaced the previous one: followed by expected_head
  // from the oldest (whose predecessor retention may have dropped), the
  // publications form one chain, strictly increasing by position, with the
  // supersede flag exactly where the epoch goes up. Returns its end.
  static Result<BoardPos> CheckChain(const std::vector<Decoded>& records) {
    std::map<uint64_t, const Decoded*> by_version;   // publications
    std::map<uint64_t, const Decoded*> by_replaced;  // expected_head -> publication
    for (const auto& d : records) {
      if (!d.advance_head) continue;
      by_version[d.key.version] = &d;
      TERN_REQUIRE(by_replaced.emplace(d.expected_head, &d).second, kCorrupt,
                   "board log: versions ", by_replaced[d.expected_head]->key.version, " and ",
                   d.key.version, " both replaced HEAD ", d.expected_head);
    }
    if (by_version.empty()) return BoardPos{};
    const Decoded* oldest = nullptr;
    for (const auto& [v, d] : by_version) {
      if (by_version.contains(d->expected_head)) continue;
      TERN_REQUIRE(oldest == nullptr, kCorrupt, "board log: versions ", oldest->key.version,
                   " and ", v, " replaced HEADs ", oldest->expected_head, " and ", d->expected_head,
                   ", neither in the log (a record is missing)");
      oldest = d;
    }
    TERN_REQUIRE(oldest != nullptr, kCorrupt, "board log: the HEAD chain has no start");
    const Decoded* at = oldest;
    size_t walked = 1;
    for (auto next = by_replaced.find(at->key.version); next != by_replaced.end();
         next = by_replaced.find(at->key.version)) {
      const Decoded* d = next->second;
      const BoardPos from{at->epoch, at->key.version}, to{d->epoch, d->key.version};
      TERN_REQUIRE(from < to && d->supersede == (to.epoch > from.epoch), kCorrupt,
                   "board log: version ", d->key.version, " (epoch ", d->epoch,
                   d->supersede ? ", supersede" : "", ") cannot replace HEAD ", at->key.version,
                   " (epoch ", at->epoch, ")");
      at = d;
      ++walked;
      TERN_ASSERT(walked <= by_version.size(), "board log chain longer than its records");
    }
    TERN_REQUIRE(walked == by_version.size(), kCorrupt, "board log: ", by_version.size() - walked,
                 " publications are off the HEAD chain (a record is missing)");
    return BoardPos{at->epoch, at->key.version};
  }

  Env& env_;
  const std::string dir_;
  // Every call takes mu_ for its whole run, I/O included: one writer or
  // reader of the directory at a time (the board's record_mu_ already
  // orders its writers).
  Mutex mu_;
  std::map<Key, uint32_t> keys_ GUARDED_BY(mu_);  // every record -> its epoch
  BoardPos head_ GUARDED_BY(mu_);
};

}  // namespace

Result<std::unique_ptr<BoardLog>> OpenFileBoardLog(Env& env, std::string dir) {
  TERN_REQUIRE(!dir.empty(), kInvalidArgument, "board log: empty directory name");
  TERN_RETURN_IF_ERROR(CreateDirs(env, dir));
  auto log = std::make_unique<FileBoardLog>(env, std::move(dir));
  TERN_RETURN_IF_ERROR(log->Load());
  return std::unique_ptr<BoardLog>(std::move(log));
}

}  // namespace tern::agent
