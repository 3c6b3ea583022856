#include "agent/etcd/etcd_board_log.h"

#include <cinttypes>
#include <cstdio>

#include "base/text.h"

namespace tern::agent {
namespace {

constexpr size_t kMaxPrefixBytes = 512;
constexpr uint32_t kMaxPageRecords = 1024;  // * 64 KiB * 4/3 (base64) < 88 MiB
constexpr size_t kVersionDigits = 20;       // UINT64_MAX has 20
constexpr size_t kSeqDigits = 2;            // kMaxManifestsPerVersion = 64
constexpr size_t kEpochDigits = 10;         // UINT32_MAX has 10

// <version>/<seq> keys: fixed-width digits (zero-padded), as RecordKey writes them.
bool FixedDigits(std::string_view s, size_t width, uint64_t* out) {
  if (s.size() != width) return false;
  const Result<uint64_t> v = ParseDecimal(s);
  if (v.ok()) *out = *v;
  return v.ok();
}

std::string HeadValue(BoardPos pos) {
  std::string out = std::to_string(pos.version);
  if (pos.epoch > 0) out += "@" + std::to_string(pos.epoch);
  return out;
}

std::string Pos(BoardPos p) {
  return std::to_string(p.version) + " (epoch " + std::to_string(p.epoch) + ")";
}

Result<BoardPos> ParseHead(const EtcdRange& range) {
  if (range.kvs.empty()) return BoardPos{};
  // HEAD is written by HeadValue: canonical decimals only, "@<epoch>" only
  // for an epoch above 0.
  const std::string_view value = range.kvs[0].value;
  const size_t at = value.find('@');
  const Result<uint64_t> head = ParseCanonicalDecimal(value.substr(0, at));
  Result<uint64_t> epoch = uint64_t{0};
  if (at != std::string_view::npos) epoch = ParseCanonicalDecimal(value.substr(at + 1), UINT32_MAX);
  TERN_REQUIRE(head.ok() && *head > 0 && epoch.ok() && (at == std::string_view::npos || *epoch > 0),
               kCorrupt, "etcd board log: ", Printable(range.kvs[0].key), " holds '",
               Printable(value.substr(0, 40)), "', not a version");
  return BoardPos{static_cast<uint32_t>(*epoch), *head};
}

}  // namespace

Result<EtcdBoardUrl> ParseEtcdBoardUrl(std::string_view url) {
  constexpr std::string_view kPlain = "etcd://";
  constexpr std::string_view kTls = "etcds://";
  TERN_REQUIRE(url.size() <= 4096, kInvalidArgument, "board URL of ", url.size(), " bytes");
  const bool tls = url.substr(0, kTls.size()) == kTls;
  TERN_REQUIRE(tls || url.substr(0, kPlain.size()) == kPlain, kInvalidArgument, "board URL '",
               Printable(url), "': want etcd://host:port[,host:port...]/prefix (etcds:// for TLS)");
  const std::string_view rest = url.substr(tls ? kTls.size() : kPlain.size());
  const size_t slash = rest.find('/');
  TERN_REQUIRE(slash != std::string_view::npos, kInvalidArgument, "board URL '", Printable(url),
               "': no /prefix after the endpoints");
  EtcdBoardUrl out;
  out.prefix = std::string(rest.substr(slash));
  TERN_REQUIRE(
      out.prefix.size() > 1 && out.prefix.size() <= kMaxPrefixBytes && out.prefix.back() != '/',
      kInvalidArgument, "board URL '", Printable(url), "': prefix '", Printable(out.prefix),
      "' (want /name, no trailing '/')");
  std::string_view hosts = rest.substr(0, slash);
  while (true) {
    const size_t comma = hosts.find(',');
    out.endpoints.push_back((tls ? "https://" : "http://") + std::string(hosts.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    hosts.remove_prefix(comma + 1);
  }
  // The client's own endpoint checks (host:port, count); it does not connect.
  EtcdOptions check;
  check.endpoints = out.endpoints;
  check.insecure = true;  // syntax only: the security rule applies where the client is made
  auto client = EtcdClient::Create(check);
  if (!client.ok()) return client.status().WithContext("board URL '" + Printable(url) + "'");
  return out;
}

Result<std::unique_ptr<EtcdBoardLog>> EtcdBoardLog::Open(EtcdOptions etcd,
                                                         EtcdBoardLogOptions options) {
  TERN_REQUIRE(!options.prefix.empty() && options.prefix.size() <= kMaxPrefixBytes &&
                   options.prefix.back() != '/',
               kInvalidArgument, "etcd board log: prefix '", Printable(options.prefix),
               "' (want 1..", kMaxPrefixBytes, " bytes, no trailing '/')");
  TERN_REQUIRE(options.page_records >= 1 && options.page_records <= kMaxPageRecords,
               kInvalidArgument, "etcd board log: page_records ", options.page_records,
               " not in 1..", kMaxPageRecords);
  auto client = EtcdClient::Create(std::move(etcd));
  if (!client.ok()) return std::move(client).take_status();
  std::unique_ptr<EtcdBoardLog> log(new EtcdBoardLog(std::move(*client), std::move(options)));
  auto head = log->Head();
  if (!head.ok()) return head.status().WithContext("opening the etcd board log");
  return log;
}

EtcdBoardLog::EtcdBoardLog(std::unique_ptr<EtcdClient> client, EtcdBoardLogOptions options)
    : client_(std::move(client)),
      prefix_(std::move(options.prefix)),
      page_records_(options.page_records),
      fence_(std::move(options.fence)) {}

void EtcdBoardLog::SetFence(std::optional<EtcdCompare> fence) {
  std::lock_guard<std::mutex> lock(mu_);
  fence_ = std::move(fence);
}

std::vector<EtcdCompare> EtcdBoardLog::Fences() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!fence_) return {};
  return {*fence_};
}

std::string EtcdBoardLog::RecordKey(BoardPos pos, uint32_t seq) const {
  char tail[80];
  if (pos.epoch == 0) {
    snprintf(tail, sizeof(tail), "/versions/%020" PRIu64 "/%02" PRIu32, pos.version, seq);
  } else {
    snprintf(tail, sizeof(tail), "/versions/e%010" PRIu32 "-%020" PRIu64 "/%02" PRIu32, pos.epoch,
             pos.version, seq);
  }
  return prefix_ + tail;
}

Result<BoardId> EtcdBoardLog::InitId(const BoardId& candidate) {
  const std::string key = prefix_ + "/id";
  const std::string bytes(reinterpret_cast<const char*>(candidate.data()), candidate.size());
  auto txn =
      client_->Txn({EtcdCompare::Absent(key)}, {EtcdOp::Put(key, bytes)}, {EtcdOp::Get(key)});
  if (!txn.ok()) return txn.status().WithContext("etcd board log: init id");
  if (txn->succeeded) return candidate;
  TERN_REQUIRE(txn->gets.size() == 1 && txn->gets[0].kvs.size() == 1, kUnavailable,
               "etcd board log: ", Printable(key), " vanished during init");
  const std::string& stored = txn->gets[0].kvs[0].value;
  BoardId id{};
  TERN_REQUIRE(stored.size() == id.size(), kCorrupt, "etcd board log: ", Printable(key), " holds ",
               stored.size(), " bytes, not a ", id.size(), "-byte board id");
  std::copy(stored.begin(), stored.end(), reinterpret_cast<char*>(id.data()));
  return id;
}

Status EtcdBoardLog::Append(BoardPos pos, uint32_t seq, std::string signed_manifest,
                            bool advance_head, BoardPos expected_head) {
  const uint64_t version = pos.version;
  TERN_REQUIRE(version > 0, kInvalidArgument, "board log: version 0");
  TERN_REQUIRE(seq < kMaxManifestsPerVersion, kInvalidArgument, "board log: seq ", seq, " (max ",
               kMaxManifestsPerVersion - 1, ")");
  TERN_REQUIRE(!signed_manifest.empty() && signed_manifest.size() <= kMaxBoardRecordBytes,
               kInvalidArgument, "board log: record of ", signed_manifest.size(),
               " bytes (want 1..", kMaxBoardRecordBytes, ")");
  TERN_REQUIRE(advance_head == (seq == 0), kInvalidArgument,
               "board log: seq 0 (and only it) advances HEAD; got seq ", seq,
               advance_head ? " with" : " without", " advance_head");
  TERN_REQUIRE(!advance_head || pos > expected_head, kInvalidArgument, "board log: ", Pos(pos),
               " is not after HEAD ", Pos(expected_head));
  const std::string record = RecordKey(pos, seq);
  const std::string head = prefix_ + "/head";
  std::vector<EtcdCompare> compares = {EtcdCompare::Absent(record)};
  std::vector<EtcdOp> success = {EtcdOp::Put(record, std::move(signed_manifest))};
  if (advance_head) {
    compares.push_back(expected_head == BoardPos{}
                           ? EtcdCompare::Absent(head)
                           : EtcdCompare::ValueIs(head, HeadValue(expected_head)));
    success.push_back(EtcdOp::Put(head, HeadValue(pos)));
  }
  const std::vector<EtcdCompare> fences = Fences();
  std::vector<EtcdOp> failure = {EtcdOp::Get(record), EtcdOp::Get(head)};
  for (const EtcdCompare& f : fences) {
    compares.push_back(f);
    failure.push_back(EtcdOp::Get(f.key));
  }
  auto txn = client_->Txn(compares, success, failure);
  if (!txn.ok()) return txn.status().WithContext("etcd board log: append");
  if (txn->succeeded) return Status::Ok();
  // Say which compare failed (the failure branch read every key compared).
  TERN_REQUIRE(txn->gets.size() == failure.size(), kProtocol, "etcd board log: txn reads");
  for (size_t i = 0; i < fences.size(); ++i) {
    const EtcdCompare& f = fences[i];
    if (f.target != EtcdCompare::Target::kCreateRevision || f.op != EtcdCompare::Op::kEqual) {
      continue;  // not one we can diagnose; reported below if nothing else failed
    }
    const EtcdRange& held = txn->gets[2 + i];
    const int64_t created = held.kvs.empty() ? 0 : held.kvs[0].create_revision;
    TERN_REQUIRE(created == f.number, kMismatch, "etcd board log: not appending version ", version,
                 ": this root no longer holds ", Printable(f.key));
  }
  TERN_REQUIRE(txn->gets[0].kvs.empty(), kAlreadyExists, "etcd board log: version ", version,
               " seq ", seq, " is already recorded");
  auto now = ParseHead(txn->gets[1]);
  if (!now.ok()) return now.status();
  TERN_REQUIRE(!advance_head || *now == expected_head, kMismatch, "etcd board log: HEAD is ",
               Pos(*now), ", not ", Pos(expected_head), " (another publisher won)");
  return TERN_ERROR(kMismatch, "etcd board log: not appending version ", version,
                    ": the fence failed");
}

Result<std::vector<BoardRecord>> EtcdBoardLog::LoadAll() {
  const std::string dir = prefix_ + "/versions/";
  std::vector<BoardRecord> records;
  std::string start;
  int64_t revision = 0;  // every page at the first page's revision: one snapshot
  while (true) {
    auto page = client_->GetPrefix(dir, page_records_, start, revision);
    if (!page.ok()) return page.status().WithContext("etcd board log: load");
    if (revision == 0) revision = page->revision;
    for (EtcdKeyValue& kv : page->kvs) {
      // <dir><20 digits>/<2 digits>, or <dir>e<10 digits>-<20 digits>/<2 digits>
      std::string_view tail = std::string_view(kv.key).substr(dir.size());
      uint64_t version = 0, seq = 0, epoch = 0;
      if (!tail.empty() && tail[0] == 'e') {
        const bool epoch_ok = tail.size() > 1 + kEpochDigits && tail[1 + kEpochDigits] == '-' &&
                              FixedDigits(tail.substr(1, kEpochDigits), kEpochDigits, &epoch) &&
                              epoch >= 1 && epoch <= UINT32_MAX;
        TERN_REQUIRE(epoch_ok, kCorrupt, "etcd board log: foreign key '", Printable(kv.key), "'");
        tail.remove_prefix(1 + kEpochDigits + 1);
      }
      const bool well_formed =
          tail.size() == kVersionDigits + 1 + kSeqDigits && tail[kVersionDigits] == '/' &&
          FixedDigits(tail.substr(0, kVersionDigits), kVersionDigits, &version) &&
          FixedDigits(tail.substr(kVersionDigits + 1), kSeqDigits, &seq) && version > 0 &&
          seq < kMaxManifestsPerVersion;
      TERN_REQUIRE(well_formed, kCorrupt, "etcd board log: foreign key '", Printable(kv.key), "'");
      TERN_REQUIRE(!kv.value.empty() && kv.value.size() <= kMaxBoardRecordBytes, kCorrupt,
                   "etcd board log: ", Printable(kv.key), " holds ", kv.value.size(),
                   " bytes (want 1..", kMaxBoardRecordBytes, ")");
      TERN_REQUIRE(records.size() < kMaxBoardRecords, kResourceExhausted,
                   "etcd board log: more than ", kMaxBoardRecords, " records");
      records.push_back(
          {version, static_cast<uint32_t>(seq), std::move(kv.value), static_cast<uint32_t>(epoch)});
    }
    if (!page->more || page->kvs.empty()) break;
    start = page->kvs.back().key + std::string(1, '\0');
  }
  return records;
}

Result<BoardPos> EtcdBoardLog::HeadPos() {
  auto range = client_->Get(prefix_ + "/head");
  if (!range.ok()) return range.status().WithContext("etcd board log: head");
  return ParseHead(*range);
}

Result<uint64_t> EtcdBoardLog::Head() {
  TERN_ASSIGN_OR_RETURN(const BoardPos head, HeadPos());
  return head.version;
}

Status EtcdBoardLog::DropBelow(BoardPos floor) {
  auto head = HeadPos();
  if (!head.ok()) return head.status();
  TERN_REQUIRE(floor <= *head, kInvalidArgument, "board log: dropping below ", Pos(floor),
               " would drop HEAD ", Pos(*head));
  if (floor <= BoardPos{0, 1}) return Status::Ok();
  // Fixed-width keys in position order: every record below `floor` sorts
  // below its key.
  const std::string from = prefix_ + "/versions/";
  const std::string to = RecordKey(floor, 0);
  auto txn = client_->Txn(Fences(), {EtcdOp::DeleteRange(from, to)}, {});
  if (!txn.ok()) return txn.status().WithContext("etcd board log: drop");
  TERN_REQUIRE(txn->succeeded, kMismatch, "etcd board log: not dropping below ", Pos(floor),
               ": this root no longer holds its fence");
  return Status::Ok();
}

}  // namespace tern::agent
