// The root's view of its members: who is joined, where each sits in the
// relay trees, what each serves, and who is silent too long. No I/O and no
// clock of its own (times are passed in), so it is tested without sockets;
// the root agent feeds it joins, heartbeats and departures and sends what it
// returns (PARENTS to the members whose parent changed).
//
// Planning is incremental (topology::AddMember / RemoveMember): one join or
// leave moves only the edges it must, and only those members are told.
//
// Thread safety: none; the root agent holds its lock around every call.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "agent/control/control_wire.h"
#include "agent/membership/probation.h"
#include "tern/status.h"
#include "tern/topology.h"

namespace tern::agent {

struct MemberRecord {
  MemberInfo info;
  uint64_t joined_us = 0;
  uint64_t last_seen_us = 0;
  Heartbeat last;          // the newest heartbeat (zeros until one came)
  uint64_t served_version = 0;
  uint64_t parents_epoch = 0;  // the epoch of the PARENTS it was last sent
  // Measured: the best rate any of its children reported receiving from it
  // (0: none yet), and whether children's reports made the root plan
  // around it (a leaf until its probation ends: agent/membership/probation.h).
  double measured_uplink_bytes_per_s = 0;
  bool demoted = false;
  // Drained by the operator (Drain): a leaf from then on, never promoted
  // again while joined, so that taking it away moves nobody.
  bool draining = false;
  RelayProbation probation;
  uint64_t stall_reported_us = 0;  // when it last reported its own parent stalled (0: never)
  // When its heartbeats' bytes_in last grew (from joined_us): a parent that
  // has received nothing itself has nothing to forward (ReportParent).
  uint64_t bytes_in_moved_us = 0;
  // When its heartbeats' wire_bytes_in last grew (0: never): bytes coming
  // off its own parent links before a whole chunk of them is verified.
  uint64_t wire_moved_us = 0;
  // Its heartbeats' (heard_us, bytes_in) over the last two stall times (or
  // two dead-after times, if longer; at most kMaxBytesInSamples): how much
  // it received before a report on it.
  std::deque<std::pair<uint64_t, uint64_t>> bytes_in_samples;
  static constexpr size_t kMaxBytesInSamples = 256;
};

class Membership {
 public:
  // The longest a parent is excused as mid-chunk (its wire bytes growing,
  // no whole chunk): this many stall times since its last whole chunk
  // (ReportParent; docs/agent.md §4).
  static constexpr uint64_t kMidChunkStallTimes = 6;

  // root: the root agent as a tree node (its id and data address are in
  // root_info). Bad options: the first Join reports them (kInvalidArgument).
  // parent_stall_us: the root's --parent-stall-ms, which its members report
  // by (WELCOME carries it; 0: no stall reports, the relative rule off).
  Membership(MemberInfo root_info, topology::PlanOptions options, uint64_t dead_after_us,
             ProbationOptions probation = {}, uint64_t parent_stall_us = 0);

  // Adds a member; the ids whose PARENTS must be (re)sent are appended to
  // *notify (the new member itself, first). kAlreadyExists for a joined id
  // (a member claiming another's identity, or a restart racing its own
  // departure: the caller refuses it), kInvalidArgument for bad fields,
  // kResourceExhausted when the plan is full.
  Status Join(const MemberInfo& info, uint64_t served_version, uint64_t now_us,
              std::vector<std::string>* notify);
  // Removes a member (leave, closed connection, silence); its children are
  // re-attached and appended to *notify. Unknown ids are ignored.
  void Leave(const std::string& id, std::vector<std::string>* notify);
  // kNotFound for an id that is not joined. The heartbeat's figures go to
  // the planner (topology::UpdateFigures; no edge moves): the member's
  // round trip to the root, and its receive rate in each stripe as a lower
  // bound on that stripe's parent's uplink.
  Status Heartbeat(const std::string& id, const agent::Heartbeat& hb, uint64_t now_us);
  // A member's report of a bad parent. The root plans around that parent
  // (topology::DemoteRelay: it becomes a leaf, its children are
  // re-attached; nobody else moves) and the moved ids go to *notify. Its
  // probation starts (agent/membership/probation.h; EndProbations ends it).
  // Refused, changing nothing: kNotFound (reporter not joined),
  // kMismatch for a stale report (that is not its parent in that
  // stripe any more), a report on the root, or a stall report on a parent
  // that starves too, so the fault is further up:
  //  - it reported its own parent stalled within dead_after_us (its report
  //    names the one above), or
  //  - by its own heartbeats (the relative rule): it was heard from within
  //    min(dead_after_us, parent_stall_us / 2), its last heartbeat shows
  //    no growth of bytes_in for parent_stall_us, it serves (relay-only:
  //    holds) nothing newer than the reporter, so it had nothing to
  //    forward, and it has been flat for less than 2 * parent_stall_us.
  //    This needs no report from the parent, so the order in which a
  //    starving chain's reports arrive no longer decides who is demoted;
  //    the bound moves a parent that cannot receive at all (or starves
  //    under the root, which is never planned around) one stall time
  //    later than before. A parent that stopped (no heartbeat), receives
  //    but does not forward, or holds a newer version is planned around
  //    as before. parent_stall_us is the root's --parent-stall-ms, which
  //    its members report by (WELCOME carries it). Limits: bytes_in
  //    counts every stripe, so with stripes > 1 a parent starving on one
  //    stripe only is not flat; versions are compared without the board
  //    epoch (heartbeats carry none), so after a supersede a parent on the
  //    new epoch with a lower number counts as holding nothing newer.
  Status ReportParent(const std::string& id, const ParentReport& report, uint64_t now_us,
                      std::vector<std::string>* notify);
  // The operator drains a member ahead of taking it away (a scheduler's
  // preemption): its children are re-attached now, and it is too, as a
  // leaf (appended to *notify; topology::DemoteRelay: nobody else moves);
  // it stays a leaf for as
  // long as it is joined (a rejoin starts afresh). kNotFound for an id that
  // is not joined; draining a drained member changes nothing.
  Status Drain(const std::string& id, std::vector<std::string>* notify);
  // Demoted members whose probation is over at now_us relay again
  // (topology::PromoteRelay: no edge moves, so nobody is told); their ids,
  // sorted. A member that joined with may_relay false stays a leaf.
  std::vector<std::string> EndProbations(uint64_t now_us);
  // Members silent for longer than dead_after_us (not removed: the caller
  // closes their connections, which calls Leave).
  std::vector<std::string> Silent(uint64_t now_us) const;

  // The PARENTS message for a member (epoch bumped on every plan change).
  // An edge inside one cluster whose ends run different intra-cluster
  // backends gets the main transport (topology::ChooseEdgeTransport); the
  // first time a cluster shows a pair of backends (at most
  // kMaxBackendNotes pairs), a line saying so is appended to *notes, for
  // the log.
  Result<Parents> ParentsOf(const std::string& id, std::vector<std::string>* notes = nullptr);
  static constexpr size_t kMaxBackendNotes = 256;
  void MarkSent(const std::string& id, uint64_t epoch);

  // A parent's own figures when a report on it is acted on, for the log:
  // when it was last heard, what its bytes_in grew by over the stall time
  // before that, what it serves, and when it last reported its own parent
  // stalled (if ever). Empty for an id not joined.
  std::string StallEvidence(const std::string& id, uint64_t now_us) const;

  bool Has(const std::string& id) const { return members_.count(id) != 0; }
  const std::map<std::string, MemberRecord>& members() const { return members_; }
  const topology::Plan& plan() const { return plan_; }
  uint64_t epoch() const { return epoch_; }
  // Depth in stripe 0 (0 when unknown).
  uint32_t DepthOf(const std::string& id) const;

 private:
  void Replan(topology::Plan next, std::vector<std::string>* notify);

  MemberInfo root_info_;
  Status init_status_;  // bad plan options, reported by Join
  topology::Plan plan_;
  uint64_t dead_after_us_;
  uint64_t parent_stall_us_;
  ProbationOptions probation_;
  uint64_t epoch_ = 0;
  // "region/cluster backend backend" pairs already noted by ParentsOf.
  std::set<std::string> backend_notes_;
  std::map<std::string, MemberRecord> members_;
};

// The planner's view of a member.
topology::Member ToTopologyMember(const MemberInfo& info);

}  // namespace tern::agent
