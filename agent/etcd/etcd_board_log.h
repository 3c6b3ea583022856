// The board's version log kept in etcd (agent/board/board_log.h's contract), so
// that a standby root elected over etcd (agent/etcd/etcd.h, Election) continues
// the same log with nothing lost. Layout (docs/agent/etcd.md):
//   <prefix>/id                               the 16-byte board id
//   <prefix>/head                             HEAD: "<v>" in epoch 0, "<v>@<epoch>" after
//   <prefix>/versions/<v: 20 digits>/<seq: 2 digits>   a signed manifest of epoch 0
//   <prefix>/versions/e<epoch: 10 digits>-<v: 20 digits>/<seq: 2 digits>   of epoch >= 1
// Keys sort by position (docs/agent/board.md §4a): digits sort below 'e', so
// every epoch-0 record below every later one, and DropBelow is one range
// delete. Epoch-0 keys and values are what they were before epochs.
// Append is one etcd txn: the record must be absent, HEAD must be
// expected_head (its key absent for {0, 0}), and the fence (when set) must
// hold; then the record and HEAD are written together. etcd makes it
// durable and atomic; a crash leaves it wholly there or wholly absent. The
// record's absence is checked under its position's key: that a number is
// not reused in another epoch is the Board's rule (agent/board/board.h).
//
// Errors, beyond board_log.h's: kMismatch also when the fence fails (this
// root is no longer the leader: nothing was written); kUnavailable when etcd
// cannot be reached (the write may or may not have happened: LoadAll tells);
// kCorrupt (naming the key) for what someone else wrote under the prefix
// that this layout does not allow (a foreign key, an empty or oversized
// record, a HEAD that is not a number, an id that is not 16 bytes).
//
// Thread safety: every method may be called from any thread at once;
// SetFence too. Several processes may share one prefix: the txns keep them
// consistent (that is the point).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/board/board_log.h"
#include "agent/etcd/etcd.h"

namespace tern::agent {

struct EtcdBoardLogOptions {
  std::string prefix;  // e.g. "/tern/board": 1 .. 512 bytes, no trailing '/'
  // When set, every write also requires it (Election::Fence()): a deposed
  // root's late Append fails in etcd instead of racing its successor.
  std::optional<EtcdCompare> fence;
  uint32_t page_records = 256;  // LoadAll reads this many records per request
};

// The agent's --board flag for an etcd board (docs/agent.md §3):
// "etcd://host:port[,host:port...]/prefix" (plain http) or "etcds://..."
// (TLS), e.g. "etcd://127.0.0.1:2379/tern/main" -> endpoints
// {"http://127.0.0.1:2379"}, prefix "/tern/main"; "etcds://" gives
// "https://" endpoints. kInvalidArgument, naming what is wrong, otherwise.
struct EtcdBoardUrl {
  std::vector<std::string> endpoints;
  std::string prefix;
};
Result<EtcdBoardUrl> ParseEtcdBoardUrl(std::string_view url);

class EtcdBoardLog final : public BoardLog {
 public:
  // Connects and reads HEAD once, so that an unreachable etcd or a foreign
  // prefix is reported here.
  static Result<std::unique_ptr<EtcdBoardLog>> Open(EtcdOptions etcd, EtcdBoardLogOptions options);

  void SetFence(std::optional<EtcdCompare> fence);

  Result<BoardId> InitId(const BoardId& candidate) override;
  Status Append(BoardPos pos, uint32_t seq, std::string signed_manifest, bool advance_head,
                BoardPos expected_head) override;
  Result<std::vector<BoardRecord>> LoadAll() override;
  Result<uint64_t> Head() override;
  Status DropBelow(BoardPos floor) override;

 private:
  EtcdBoardLog(std::unique_ptr<EtcdClient> client, EtcdBoardLogOptions options);
  std::vector<EtcdCompare> Fences() const;
  std::string RecordKey(BoardPos pos, uint32_t seq) const;
  Result<BoardPos> HeadPos();

  std::unique_ptr<EtcdClient> client_;
  const std::string prefix_;
  const uint32_t page_records_;
  mutable std::mutex mu_;
  std::optional<EtcdCompare> fence_;  // guarded by mu_
};

}  // namespace tern::agent
