#include "agent/etcd/etcd_key_sets.h"

#include <cinttypes>
#include <cstdio>

#include "base/text.h"

namespace tern::agent {
namespace {

constexpr size_t kMaxPrefixBytes = 512;
constexpr size_t kSeqDigits = 20;  // UINT64_MAX has 20

}  // namespace

Result<std::unique_ptr<EtcdKeySets>> EtcdKeySets::Open(EtcdOptions etcd, EtcdKeySetsOptions options) {
  TERN_REQUIRE(!options.prefix.empty() && options.prefix.size() <= kMaxPrefixBytes &&
                   options.prefix.back() != '/',
               kInvalidArgument, "etcd key sets: prefix of ", options.prefix.size(),
               " bytes (want 1..", kMaxPrefixBytes, ", no trailing '/')");
  TERN_REQUIRE(options.max_key_sets >= 1 && options.max_key_set_bytes >= 1 &&
                   options.max_key_set_bytes <= kEtcdMaxValueBytes,
               kInvalidArgument, "etcd key sets: bounds of ", options.max_key_sets, " entries of ",
               options.max_key_set_bytes, " bytes");
  auto client = EtcdClient::Create(std::move(etcd));
  if (!client.ok()) return std::move(client).take_status();
  return std::unique_ptr<EtcdKeySets>(new EtcdKeySets(std::move(*client), std::move(options)));
}

EtcdKeySets::EtcdKeySets(std::unique_ptr<EtcdClient> client, EtcdKeySetsOptions options)
    : client_(std::move(client)), options_(std::move(options)) {}

std::string EtcdKeySets::Key(uint64_t seq) const {
  char tail[48];
  snprintf(tail, sizeof(tail), "/key-sets/%020" PRIu64, seq);
  return options_.prefix + tail;
}

Result<std::vector<std::string>> EtcdKeySets::Load() {
  const std::string dir = options_.prefix + "/key-sets/";
  // One page one past the bound: more entries than that is refused, not cut.
  auto range = client_->GetPrefix(dir, options_.max_key_sets + 1);
  if (!range.ok()) return range.status().WithContext("etcd key sets: load");
  TERN_REQUIRE(range->kvs.size() <= options_.max_key_sets && !range->more, kCorrupt, "etcd key sets: more than ",
               options_.max_key_sets, " key sets under ", Printable(dir));
  std::vector<std::string> chain;
  for (const EtcdKeyValue& kv : range->kvs) {
    const std::string_view tail = std::string_view(kv.key).substr(dir.size());
    const Result<uint64_t> parsed = ParseDecimal(tail);
    TERN_REQUIRE(tail.size() == kSeqDigits && parsed.ok(), kCorrupt, "etcd key sets: foreign key '",
                 Printable(kv.key), "'");
    const uint64_t seq = *parsed;
    // Keys sort by number: 1, 2, ... with no gap, or a writer other than
    // Put (which never leaves one) was there.
    TERN_REQUIRE(seq == chain.size() + 1, kCorrupt, "etcd key sets: '", Printable(kv.key),
                 "' where key set ", chain.size() + 1, " was expected (a gap in the chain)");
    TERN_REQUIRE(!kv.value.empty() && kv.value.size() <= options_.max_key_set_bytes, kCorrupt,
                 "etcd key sets: '", Printable(kv.key), "' holds ", kv.value.size(), " bytes (want 1..",
                 options_.max_key_set_bytes, ")");
    chain.push_back(kv.value);
  }
  return chain;
}

Status EtcdKeySets::Put(uint64_t seq, std::string_view signed_key_set) {
  TERN_REQUIRE(seq >= 1 && seq <= options_.max_key_sets, kInvalidArgument, "etcd key sets: key set ", seq,
               " (want 1..", options_.max_key_sets, ")");
  TERN_REQUIRE(!signed_key_set.empty() && signed_key_set.size() <= options_.max_key_set_bytes,
               kInvalidArgument, "etcd key sets: key set of ", signed_key_set.size(), " bytes (want 1..",
               options_.max_key_set_bytes, ")");
  const std::string key = Key(seq);
  std::vector<EtcdCompare> compares = {EtcdCompare::Absent(key)};
  std::vector<EtcdOp> failure = {EtcdOp::Get(key)};
  if (seq > 1) {
    compares.push_back({Key(seq - 1), EtcdCompare::Target::kCreateRevision, EtcdCompare::Op::kGreater, {}, 0});
    failure.push_back(EtcdOp::Get(Key(seq - 1)));
  }
  if (options_.fence) {
    compares.push_back(*options_.fence);
    failure.push_back(EtcdOp::Get(options_.fence->key));
  }
  auto txn = client_->Txn(compares, {EtcdOp::Put(key, std::string(signed_key_set))}, failure);
  if (!txn.ok()) return txn.status().WithContext("etcd key sets: put key set " + std::to_string(seq));
  if (txn->succeeded) return Status::Ok();
  TERN_REQUIRE(txn->gets.size() == failure.size(), kProtocol, "etcd key sets: txn reads");
  // Said in order of what matters: a retried write that already landed is
  // fine whoever leads now; a fork is refused; then the fence and the gap.
  if (!txn->gets[0].kvs.empty()) {
    TERN_REQUIRE(txn->gets[0].kvs[0].value == signed_key_set, kMismatch, "etcd key sets: etcd holds another key set ",
                 seq, " (two key sets of one number: a fork of the chain); nothing written");
    return Status::Ok();
  }
  if (options_.fence) {
    const EtcdRange& held = txn->gets.back();
    const EtcdCompare& f = *options_.fence;
    const bool diagnosable = f.target == EtcdCompare::Target::kCreateRevision && f.op == EtcdCompare::Op::kEqual;
    const int64_t created = held.kvs.empty() ? 0 : held.kvs[0].create_revision;
    TERN_REQUIRE(!diagnosable || created == f.number, kMismatch, "etcd key sets: not writing key set ", seq,
                 ": this root no longer holds ", Printable(f.key));
  }
  TERN_REQUIRE(seq == 1 || !txn->gets[1].kvs.empty(), kMismatch, "etcd key sets: not writing key set ", seq,
               ": etcd does not hold key set ", seq - 1);
  return TERN_ERROR(kMismatch, "etcd key sets: not writing key set ", seq, ": the fence failed");
}

}  // namespace tern::agent
