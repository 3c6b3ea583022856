// The Agent's implementation (include/tern/agent.h), private to agent/.
// One class, five files in agent/daemon/ by role:
//   agent.cc               start (Init), the shared listener (Accept,
//                          StartListener), the relay (MakeRelay), the work
//                          thread (Post, WorkLoop), the ticker (TickLoop), Stop
//   agent_root.cc          the root: election (CampaignForRoot), InitRoot,
//                          control from members, publishing (Publish,
//                          PublishLocked), re-planning notices, RootTick
//   agent_member.cc        a member: joining and redialling, manifests,
//                          objects received, apply (MemberApplyObject), seed,
//                          catch-up, forgetting old objects, heartbeats
//   agent_member_files.cc  a member's model files: fetched by content from
//                          the root's object service, checked, cached
//   agent_member_links.cc  a member's parents: round trips, probes, watching
//                          for stalled parents
//   agent_status.cc        Snapshot, /status JSON, /metrics text and the admin
//                          routes (StartAdmin)
//   agent_operator.cc      the root's operator calls (drain, remove,
//                          retention) and their admin routes
//   agent_beacons.cc       signed HEAD beacons: the root sends them, a member
//                          checks them and tracks its freshness
//   agent_events.cc        events (WaitEvents, GET /events) and where they
//                          are pushed from; the --on-serve hook: serve_hook.h
//
// Threads and locks. Transport callbacks (backend threads) only decode,
// update state under mu_ and queue work; they never block. Work that takes
// time — applying a version, fetching catch-up objects, re-planning
// notifications — runs on the agent's one work thread, in order. The ticker
// thread sends heartbeats, expires silent members and re-dials the root.
// Calls into a Connection (SendMessage, Close) are made without mu_ held: a
// backend may run on_closed inside Close, and on_closed takes mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/board/board.h"
#include "agent/board/publish.h"
#include "agent/control/control_wire.h"
#include "agent/daemon/dial_backoff.h"
#include "agent/daemon/event_ring.h"
#include "agent/daemon/publish_jobs.h"
#include "agent/daemon/stall_watch.h"
#include "agent/etcd/etcd.h"
#include "agent/etcd/etcd_board_log.h"
#include "agent/etcd/etcd_key_sets.h"
#include "agent/freshness/freshness.h"
#include "agent/membership/format_choice.h"
#include "agent/membership/membership.h"
#include "agent/relay/relay.h"
#include "agent/view_store/view_store.h"
#include "base/mutex.h"
#include "tern/agent.h"
#include "tern/checkpoint.h"
#include "tern/thread_pool.h"
#include "tern/version_manifest.h"
#include "tern/xfer.h"

namespace tern::agent {

class AdminServer;
class MetricsRegistry;
class RankPartJobs;
class ServeHook;
class EngineDriver;
class SlotLease;
struct AdminRoute;

// The tensors a patch changes (records in its manifest), sorted; *all when
// the patch cannot say or names more than kMaxEventTensors.
std::vector<std::string> ChangedTensors(std::span<const uint8_t> patch, bool* all);

// The root's publish spans by name, in the order they run: the log line
// (the stages, which add up to offered_s) and /status (every field, with
// "_s") read this one list.
struct PublishSpanField {
  const char* name;
  double AgentPublishSpans::*seconds;
  bool stage;  // one stage of the publish; false: a sum (offered, total)
};
inline constexpr PublishSpanField kPublishSpanFields[] = {
    {"prepare", &AgentPublishSpans::prepare_s, true},
    {"verify_prev", &AgentPublishSpans::verify_prev_s, true},
    {"diff", &AgentPublishSpans::diff_s, true},
    {"keyframe", &AgentPublishSpans::keyframe_s, true},
    {"hash", &AgentPublishSpans::hash_s, true},
    {"sign", &AgentPublishSpans::sign_s, true},
    {"write", &AgentPublishSpans::write_s, true},
    {"record", &AgentPublishSpans::record_s, true},
    {"handoff", &AgentPublishSpans::handoff_s, true},
    {"announce", &AgentPublishSpans::announce_s, true},
    {"offered", &AgentPublishSpans::offered_s, false},
    {"apply", &AgentPublishSpans::apply_s, true},
    {"retain", &AgentPublishSpans::retain_s, true},
    {"total", &AgentPublishSpans::total_s, false},
};

// Transport handlers may run after the agent stopped (a connection's
// on_closed during the transport's own shutdown): each handler holds this
// gate shared for its whole run and does nothing once it is shut; Stop
// shuts it (waiting for handlers in flight) before anything else. A handler
// may re-enter (Close can run on_closed inline): glibc's rwlock prefers
// readers, so a nested shared lock does not wait behind Stop.
struct HandlerGate {
  SharedMutex mu;
  bool open GUARDED_BY(mu) = true;
};

// A version being assembled from trainer ranks' parts (agent_ranks.cc).
// At namespace scope, not nested in AgentImpl: clang takes a nested
// struct's default member initializers as unparsed inside the enclosing
// class, and std::optional<RankAssembly>'s emplace() then is not viable.
struct RankAssembly {
  uint64_t generation = 0;
  uint64_t version = 0;
  uint32_t world_size = 0;
  std::map<uint32_t, RankPart> parts;
  std::chrono::steady_clock::time_point deadline;
  uint32_t timeout_ms = 0;
  bool committing = false;
};

class AgentImpl final : public Agent {
 public:
  explicit AgentImpl(const AgentOptions& options);
  ~AgentImpl() override;

  Status Init();
  Status Publish(const std::string& checkpoint_path, uint64_t version) override;
  Status Supersede(const std::string& checkpoint_path, uint64_t version) override;
  Status DrainMember(const std::string& id) override;
  Status RemoveMember(const std::string& id, uint32_t rejoin_after_ms) override;
  Status SetRetention(uint32_t keep_patches, uint32_t keyframe_every) override;
  Status RotateKeys(std::string_view signed_key_set, std::string_view signing_key_pem) override;
  // The admin routes of the three calls above (agent_operator.cc).
  std::vector<AdminRoute> OperatorRoutes();
  std::vector<AdminRoute> KeyRoutes();  // agent_keys.cc
  Status PublishTensors(uint64_t version, const std::vector<PublishTensor>& tensors) override;
  Status PublishRankPart(RankPart part, uint32_t timeout_ms) override;
  // A rank that restarted mid-version resumes it (POST /publish/rank-part
  // ?resume=1): its part joins only the gathering of its version that is
  // open, with the other parts' base version; otherwise kMismatch, nothing
  // taken and the gathering untouched, saying what to do.
  Status ResumeRankPart(RankPart part, uint32_t timeout_ms);
  AgentSnapshot Snapshot() const override;
  std::string PublicKeyPem() const override;
  Status WaitEvents(uint64_t after_seq, size_t max_events, uint32_t timeout_ms,
                    std::vector<AgentEvent>* out) override;
  void Stop() override;

 private:
  // A message to send once mu_ is released.
  struct Outgoing {
    std::shared_ptr<Connection> conn;
    std::string payload;
  };
  using Outbox = std::vector<Outgoing>;
  void Flush(Outbox& out);
  void Send(Outbox& out, const std::shared_ptr<Connection>& conn, const ControlMessage& m);
  void Log(const std::string& line) const;
  double NowS() const { return static_cast<double>(clock_.NowUs()) * 1e-6; }

  // ---- agent.cc ----
  Status StartListener();
  // `via`: the transport whose listener accepted conn (data links remember
  // it: the relay sends a child's chunks through the transport it came on).
  ConnectionHandlers Accept(std::shared_ptr<Connection> conn, Transport* via);
  // The relay, with the intra transport added when there is one. Under mu_
  // for a member (Accept reads relay_ under it).
  Status MakeRelay(const BoardId& board, RelayCallbacks callbacks);
  void Post(std::function<void()> work);  // onto the work thread
  void WorkLoop();
  void TickLoop();
  // Logs mu_'s slow holds since the last call (TickLoop's thread).
  void LogSlowLockHolds();
  Status StartAdmin();
  Result<std::string> AdmitAdminPublish(const std::string& checkpoint, uint64_t version,
                                        const PublishFlags& flags) const;
  // A supersede's rules (docs/agent/board.md §4a) against the board as it
  // stands: version below HEAD, not 0, not a number the log holds.
  Status AdmitSupersede(uint64_t version) const;
  std::string StatusJson() const;
  std::string MetricsText() const;

  // ---- agent_events.cc ----
  // Served: DIR/current's slot is resolved here (call right after the switch).
  void EmitServed(uint64_t version, const ViewDigest& digest, bool all,
                  std::vector<std::string> changed) EXCLUDES(mu_);
  void EmitPublished(uint64_t version, const ViewDigest& digest, bool all,
                     std::vector<std::string> changed);
  void EmitMember(AgentEvent::Kind kind, const std::string& member);
  AdminRoute EventsRoute();

  // ---- agent_root.cc ----
  Status InitRoot();
  // The root's key-set chain after key set 0, merged from DIR/key-sets, the
  // board in etcd and --key-set (agent_root.cc says how), each applied to
  // `v` in order, so that `v` ends at the last set.
  struct RootKeyChain {
    std::vector<std::string> sets;  // signed, in order: key sets 1..N
    std::vector<KeySet> decoded;    // the same, decoded
    size_t in_dir = 0;              // how many DIR/key-sets held
    size_t on_board = 0;            // how many the board in etcd held
  };
  Result<RootKeyChain> CollectRootKeySets(ManifestVerifier& v);
  // `chain` onto verifier_, kept in DIR/key-sets and the board in etcd; the
  // signer must be trusted after.
  Status ApplyRootKeySets(const RootKeyChain& chain);
  void RootOnControl(const std::shared_ptr<Connection>& conn, std::string* member_id,
                     ControlMessage m);
  void RootOnClosed(const std::string& member_id, const std::shared_ptr<Connection>& conn);
  void RootTick();
  void RootNotifyParents(const std::vector<std::string>& ids, Outbox& out) REQUIRES(mu_);
  // t0: when Publish was called (NowS), before it waited for publish_mu_.
  // supersede: renumber below HEAD into the next epoch (Agent::Supersede).
  Status PublishLocked(double t0, const std::string& checkpoint_path, uint64_t version,
                       bool supersede = false) REQUIRES(publish_mu_);
  // The part of a publish after `next` is known (a checkpoint's or the
  // caller's tensors): sign and store (PublishVersion), offer it to the
  // trees, announce HEAD, then serve it here (Seed from seed_checkpoint,
  // or the keyframe / patch just written). `prev` (DIR/current, mapped) and
  // `next_owner` are released as soon as they are no longer read.
  // The patch format is format_chooser_'s (options.format_version is ignored).
  Status PublishViewLocked(double t0, uint64_t version, std::unique_ptr<Checkpoint> prev,
                           const ServeView& next, std::unique_ptr<Checkpoint> next_owner,
                           const std::string& seed_checkpoint, const PublishOptions& options,
                           const std::vector<SlotFile>& slot_files) REQUIRES(publish_mu_);
  // PublishViewLocked's tail, and a version assembled from ranks': offer
  // the objects of the version just recorded and send HEAD, then serve it
  // here, retention (docs/agent/board.md §4, "The root's publish, in
  // order"). Fills versions_[version].publish with the spans; published_s:
  // when PublishVersion / PublishPatch returned (the version recorded).
  Status ServeAndAnnounceLocked(double t0, double published_s, uint64_t version,
                                const PublishResult& result, uint64_t view_bytes,
                                const std::string& seed_checkpoint,
                                const std::vector<SlotFile>& slot_files) REQUIRES(publish_mu_);
  // ServeAndAnnounceLocked's own apply: DIR/current to the version just
  // recorded (Seed, the keyframe, or Advance by the patch).
  Status ServeOwnLocked(uint64_t version, const PublishResult& result,
                        const std::vector<ObjectRef>& refs, const std::optional<ObjectRef>& patch,
                        const std::string& seed_checkpoint, const std::vector<SlotFile>& slot_files)
      REQUIRES(publish_mu_);

  // ---- agent_ranks.cc ----
  Status GatherRankPart(RankPart part, uint32_t timeout_ms, bool resume);
  // The digest terms of a resumed part's shards in the root's own view of
  // its base version: nullopt unless the root serves that version and each
  // shard is an element range of a tensor with the part's layout (the
  // assembly's checks speak then). Takes publish_mu_ so the view holds still.
  std::optional<ViewDigest> BaseTermsInOwnView(const RankPart& part) EXCLUDES(publish_mu_, ranks_mu_);
  // GET /view/rows (agent/daemon/view_rows.h): the root's own bytes of one
  // tensor's element range, read under publish_mu_ so that no version is
  // applied meanwhile. A publish holds that lock for its whole length, so
  // the handler waits for it at most kViewRowsWaitMs and then answers 503
  // (ask again): an admin handler must not wait out a publish.
  AdminRoute ViewRowsRoute();
  AdminResponse ViewRows(const AdminRequest& req) EXCLUDES(publish_mu_);
  static constexpr int kViewRowsWaitMs = 1000;
  // Joins and commits the parts of one version (PublishRankPart).
  // Fails the version being gathered (kCancelled) and refuses new parts,
  // so that Stop need not wait for a gathering deadline.
  void CloseRankParts();
  Status CommitRankParts(std::vector<RankPart> parts, uint64_t version, uint32_t world_size)
      REQUIRES(publish_mu_);

  // ---- agent_member.cc ----
  Status InitMember();
  void MemberDial();
  void MemberOnControl(ControlMessage m);
  void MemberOnClosed(const std::shared_ptr<Connection>& conn, const Status& why);
  void MemberTick();
  bool MemberAcceptManifest(const std::string& signed_manifest, const VersionManifest& m);
  void MemberObjectComplete(const ObjectRef& ref, const std::string& path);
  void RelayOnlyObjectComplete(const ObjectRef& ref);
  void MemberObjectPrefix(const ObjectRef& ref, const std::string& part_path, uint64_t bytes);
  void MemberTryApply();
  Status MemberApplyObject(const ObjectRef& ref, const std::string& path);
  void MemberPrepareSpare();
  // Work thread, before any write to the spare slot: waits (bounded) while
  // the engine driver still reads it (engine_driver.h, "The slot lease").
  void WaitEngineOffSpare();
  // The absolute slot DIR/current points at now; "" when it points nowhere.
  std::string CurrentSlot() const;
  Status InitEngine();
  // ---- agent_member_files.cc ----
  // Version's model files (its manifest's), fetched into DIR/files when
  // missing and checked against their signed SHA-256 (kAuth: refused).
  Result<std::vector<SlotFile>> MemberModelFiles(uint64_t version);
  void MemberForgetModelFiles();
  // A version whose files could not be had (the object service away, bytes
  // that do not match) waits in ready_ and is tried again a second later,
  // kModelFileAttemptsMax times in all; then it waits for the next version
  // or catch-up. By target version; pruned below the served one.
  std::map<uint64_t, uint32_t> files_attempts_ GUARDED_BY(mu_);
  uint64_t files_retry_us_ GUARDED_BY(mu_) = 0;  // MemberTryApply again then (0: none due)
  void MemberCatchUp(CatchUpReply plan);
  Status SaveMemberState() REQUIRES(mu_);
  Result<RelayNode*> EnsureRelay(const BoardId& board) REQUIRES(mu_);
  // The relay's link figures, read without mu_ (RelayNode takes its own
  // lock, which its worker holds while it lands and forwards chunks: read
  // under mu_, the agent's every thread waited on the relay's worker — up to
  // 0.33 s per tick while a keyframe passed, docs/agent/operations.md "The
  // agent's lock"). Empty before the relay exists.
  struct RelayFigures {
    std::vector<LinkStats> links;
    LinkTotals totals;
  };
  RelayFigures ReadRelayFigures() EXCLUDES(mu_);
  // The relay, or null before it is made. It is made under mu_
  // (EnsureRelay) and reset only after the agent's threads end, so the
  // pointer stays good for the calling thread without mu_: callers use it
  // after releasing mu_, since the relay's calls take its own lock.
  RelayNode* RelayNow() const EXCLUDES(mu_);
  Heartbeat MakeHeartbeatLocked(const RelayFigures& relay) REQUIRES(mu_);
  // A patch of `format` over a view of view_bytes was applied in apply_s,
  // onto a prepared spare or not.
  void NoteApplyRateLocked(uint16_t format, uint64_t view_bytes, double apply_s, bool prepared)
      REQUIRES(mu_);
  // ---- agent_member_links.cc: round trips and parent health ----
  void MemberProbeParents();
  void MemberOnPong(const std::string& address, const std::shared_ptr<Connection>& conn,
                    uint64_t nonce);
  void MemberWatchParentsLocked(Outbox& out, const std::vector<LinkStats>& links) REQUIRES(mu_);
  double RoundTripOf(uint64_t nonce) const;
  // ---- agent_beacons.cc: signed HEAD beacons and freshness ----
  Status CheckFreshnessOptions() const;
  uint64_t WallUnixMs() const;
  void RootBeaconTick();  // the tick thread only
  void MemberOnBeaconLocked(const Beacon& m) REQUIRES(mu_);
  // KEY_SETS: each key set newer than verifier_'s, in order, kept in
  // DIR/key-sets (agent_member.cc).
  void MemberOnKeySets(const KeySets& m) REQUIRES(mu_);
  // At start: the key sets an earlier run learned, applied again, so a
  // restarted member refuses a revoked key before it reaches the root.
  void LoadMemberKeySets();
  Status SaveMemberKeySets() REQUIRES(mu_);
  std::vector<std::string> learned_key_sets_ GUARDED_BY(mu_);  // applied, in order
  // The control connection to drop: no valid beacon on it for stale_after_ms.
  std::shared_ptr<Connection> MemberCutOffLocked() REQUIRES(mu_);
  void FreshnessSnapshotLocked(AgentSnapshot& s) const REQUIRES(mu_);
  // The transport a parent edge is dialled with (PARENTS says which).
  Transport* TransportOf(const ParentRef& p) const {
    return p.intra && opt_.intra_transport ? opt_.intra_transport : opt_.transport;
  }

  const std::shared_ptr<HandlerGate> gate_ = std::make_shared<HandlerGate>();
  const AgentOptions opt_;
  Env& env_;
  Clock& clock_;
  LogFn log_;
  ThreadPool pool_;
  // Set by Init once the listener is up (it may be the listen address),
  // before control traffic is served (started_); handlers that run earlier
  // refuse and log, so Log reads its own copy, log_name_.
  std::string id_;
  std::atomic<std::shared_ptr<const std::string>> log_name_;
  std::string objects_dir_;    // DIR/objects: what the relay receives and serves
  std::string published_dir_;  // root: DIR/published, the board's objects

  ManifestVerifier verifier_;
  // Root: the key it signs with. RotateKeys swaps it between publications;
  // every user takes its own reference (Signer()), so a beacon or squash in
  // flight ends with the key it began with. signer_mu_ is a leaf: taken
  // alone, under mu_ or under publish_mu_, never the other way.
  mutable Mutex signer_mu_;
  std::shared_ptr<const ManifestSigner> signer_ GUARDED_BY(signer_mu_);
  std::shared_ptr<const ManifestSigner> Signer() const;
  // Root: the key it added to key set 0 for itself at start (none when the
  // configured keys had it, or DIR/key-set-0.pub stood in); RotateKeys keeps
  // its public key in DIR/key-set-0.pub. Set by InitRoot, read under publish_mu_.
  std::shared_ptr<const ManifestSigner> root_key0_;
  // Root: the key sets applied after key set 0, in order (DIR/key-sets,
  // --key-set, RotateKeys); sent to each member when it joins.
  std::vector<std::string> root_key_sets_ GUARDED_BY(mu_);
  // Set by Init; then used by one thread at a time: a member's work thread,
  // the root's Publish (under publish_mu_). Others read store_version_ and
  // store_digest_ (mu_).
  std::unique_ptr<ViewStore> store_;
  std::unique_ptr<RelayNode> relay_;
  std::unique_ptr<Listener> listener_;
  std::string listen_address_;
  std::unique_ptr<Listener> intra_listener_;  // with opt_.intra_transport
  std::string intra_address_;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<PublishJobs> publish_jobs_;  // root: publishes behind POST /publish
  std::unique_ptr<RankPartJobs> rank_part_jobs_;  // root: POST /publish/rank-part (agent_ranks.cc)
  std::unique_ptr<AdminServer> admin_;
  std::string admin_address_;
  // Events (agent_events.cc): the ring has its own lock, taken after mu_
  // when both are held; closed first by Stop.
  const std::unique_ptr<EventRing> events_;
  std::atomic<uint32_t> events_listeners_{0};  // GET /events waiting now
  std::unique_ptr<ServeHook> serve_hook_;      // with on_serve_command
  // The engine beside a member (engine_driver.h), with opt_.engine: the
  // work thread calls WaitEngineOffSpare before it writes the spare.
  std::unique_ptr<SlotLease> slot_lease_;
  std::unique_ptr<EngineDriver> engine_;

  // Watches mu_'s holds (base/mutex.h); declared first, it outlives mu_.
  LockWatch lock_watch_{uint64_t{kSlowAgentLockHoldMs} * 1000};
  uint64_t lock_logged_seq_ = 0;        // TickLoop's: slow holds logged so far
  uint64_t relay_lock_logged_seq_ = 0;  // and of the relay's lock
  mutable Mutex mu_;
  CondVar work_cv_{&mu_};
  std::deque<std::function<void()>> work_ GUARDED_BY(mu_);  // bounded by kMaxQueuedWork
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread work_thread_, tick_thread_;
  Mutex stop_mu_ ACQUIRED_BEFORE(mu_);
  bool stopped_ GUARDED_BY(stop_mu_) = false;

  // ---- root state (mu_) ----
  std::unique_ptr<Board> board_;
  std::unique_ptr<Election> election_;     // with board_etcd
  // With board_etcd: the key-set chain beside the board (set in InitRoot,
  // before any thread reads it), so a standby that takes over learns it.
  std::unique_ptr<EtcdKeySets> board_key_sets_;
  std::atomic<bool> leadership_lost_{false};
  bool started_ GUARDED_BY(mu_) = false;  // Init finished: control traffic is served
  Status CampaignForRoot();
  // The etcd client's options for board_etcd: its endpoints, TLS and user.
  EtcdOptions BoardEtcdOptions(const EtcdBoardUrl& url) const;
  std::unique_ptr<FileServer> fetch_server_;
  std::unique_ptr<Membership> membership_ GUARDED_BY(mu_);
  // Root: each version's patch format (agent/membership/format_choice.h).
  std::optional<FormatChooser> format_chooser_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Connection>> member_conns_ GUARDED_BY(mu_);
  // Root: ids an operator removed, and until when (clock_ µs) their joins
  // are refused (RemoveMember). Bounded: expired entries go at each removal,
  // and at most kMaxRemoved are kept (the oldest deadline goes first).
  std::map<std::string, uint64_t> removed_until_us_ GUARDED_BY(mu_);
  static constexpr size_t kMaxRemoved = 4096;
  std::map<uint64_t, AgentVersionStatus> versions_ GUARDED_BY(mu_);
  // Version -> members not yet serving it.
  std::map<uint64_t, std::set<std::string>> waiting_ GUARDED_BY(mu_);
  Mutex publish_mu_ ACQUIRED_BEFORE(mu_);  // one publish at a time (not mu_: it takes seconds)
  // GET /view/rows' opened view of the version the root serves, opened
  // once per version rather than per request (a header parse per request
  // made a rank that owns slices of n tensors pay O(n) per range, O(n^2)
  // in all); dropped before the root's view changes (ServeOwnLocked), so
  // it never holds a slot that is being rewritten, nor an old one's files.
  std::unique_ptr<Checkpoint> rows_view_ GUARDED_BY(publish_mu_);
  uint64_t rows_view_version_ GUARDED_BY(publish_mu_) = 0;
  // Publishing from ranks (agent_ranks.cc): the version being gathered.
  // ranks_mu_ is never held with publish_mu_ (the committing caller lets go
  // of it first), so it has no order against it.
  Mutex ranks_mu_;
  CondVar ranks_cv_{&ranks_mu_};
  std::optional<RankAssembly> assembly_ GUARDED_BY(ranks_mu_);
  bool ranks_closed_ GUARDED_BY(ranks_mu_) = false;
  uint64_t next_generation_ GUARDED_BY(ranks_mu_) = 1;
  // Generation -> outcome, for the callers still waiting (the last 64).
  std::map<uint64_t, Status> rank_outcomes_ GUARDED_BY(ranks_mu_);
  // Each rank's shards and their terms in the last version committed from
  // ranks (its part's target): a resumed part's base is checked against
  // them before it joins when the root's own view of the base version is
  // not there to hash (BaseTermsInOwnView). Lost on a restart or takeover.
  struct RankTerms {
    std::vector<RankShardRange> shards;
    ViewDigest terms;
  };
  uint64_t rank_terms_version_ GUARDED_BY(ranks_mu_) = 0;
  std::map<uint32_t, RankTerms> rank_terms_ GUARDED_BY(ranks_mu_);

  // ---- member state (mu_) ----
  BoardId board_id_ GUARDED_BY(mu_){};  // pinned at the first WELCOME (DIR/agent.json)
  bool joined_ GUARDED_BY(mu_) = false;
  std::shared_ptr<Connection> root_conn_ GUARDED_BY(mu_);
  bool dialing_ GUARDED_BY(mu_) = false;
  uint64_t next_dial_us_ GUARDED_BY(mu_) = 0;
  // The newest HEAD this member knows, by position (epoch, version): a
  // supersede's HEAD has a higher epoch and a lower number.
  uint64_t known_head_ GUARDED_BY(mu_) = 0;
  uint32_t known_head_epoch_ GUARDED_BY(mu_) = 0;
  void NoteHeadLocked(uint32_t epoch, uint64_t version) REQUIRES(mu_) {
    if (BoardPos{epoch, version} > BoardPos{known_head_epoch_, known_head_}) {
      known_head_epoch_ = epoch;
      known_head_ = version;
    }
  }
  BoardPos KnownHeadLocked() const REQUIRES(mu_) { return {known_head_epoch_, known_head_}; }
  // The position of version v as this agent knows it: the root's board's,
  // or a member's accepted manifest's epoch, else the served epoch (numbers
  // are unique in the board's log, so a number names one position).
  BoardPos PosOfLocked(uint64_t v) const REQUIRES(mu_);
  void TrimManifestsLocked() REQUIRES(mu_);
  std::string fetch_address_ GUARDED_BY(mu_);
  std::vector<std::string> join_addresses_ GUARDED_BY(mu_);  // --join, split at commas
  size_t join_index_ GUARDED_BY(mu_) = 0;                    // the one dialled next
  std::string dial_address_ GUARDED_BY(mu_);                 // the one being dialled
  Parents parents_ GUARDED_BY(mu_);
  uint32_t stripes_ GUARDED_BY(mu_) = 1;
  // Member: the board's timing from WELCOME (the root's --heartbeat-ms and
  // --parent-stall-ms), which rules over this agent's own flags once joined.
  uint32_t board_parent_stall_ms_ GUARDED_BY(mu_) = 0;
  std::atomic<uint32_t> board_heartbeat_ms_{0};  // 0: not joined yet (TickLoop: opt_'s)
  uint64_t heartbeat_seq_ GUARDED_BY(mu_) = 0;
  // The totals the last heartbeat carried: figures read before mu_ may be
  // older than a heartbeat another thread sent meanwhile, and the root
  // exports them as counters, which must not go down.
  struct SentTotals {
    uint64_t bytes_in = 0, bytes_out = 0, chunk_retries = 0;
  } sent_totals_ GUARDED_BY(mu_);
  double last_apply_s_ GUARDED_BY(mu_) = 0;
  // Member: its apply rate per format (1, 2), for the root's format choice
  // (HEARTBEAT).
  ApplyRateFigure apply_rate_[2] GUARDED_BY(mu_);
  uint64_t spare_due_us_ GUARDED_BY(mu_) = 0;  // PrepareSpare after this (0: nothing due)
  // Work thread only: the patch streaming into the spare
  // (ViewStore::AdvancePrefix) and our own mapping of its ".part" file,
  // valid whatever the relay does with the file meanwhile.
  ObjectRef stream_ref_;
  std::unique_ptr<MappedFile> stream_file_;
  bool catching_up_ GUARDED_BY(mu_) = false;
  uint64_t catch_up_deadline_us_ GUARDED_BY(mu_) = 0;  // a request unanswered by then is given up
  uint64_t catch_up_next_us_ GUARDED_BY(mu_) = 0;      // the next periodic check
  bool need_catch_up_check_ GUARDED_BY(mu_) = false;
  // A seed checkpoint not yet adopted or refused (AgentOptions::seed_*).
  bool seed_pending_ GUARDED_BY(mu_) = false;
  // Per stripe of parents_: when its parent is dialled (again), and the
  // failures since PARENTS named it (agent/daemon/dial_backoff.h).
  std::vector<ParentRedial> parent_redial_ GUARDED_BY(mu_);
  // store_->version() and store_->digest(), copied under mu_ by the thread
  // that changed the store (NoteServedLocked): the store itself has one
  // caller at a time (the work thread; the root's publishing thread), so
  // every other thread (Snapshot, heartbeats, transport callbacks) reads
  // these copies, never store_.
  uint64_t store_version_ GUARDED_BY(mu_) = 0;
  uint32_t store_epoch_ GUARDED_BY(mu_) = 0;  // store_->epoch(), the served version's
  ViewDigest store_digest_ GUARDED_BY(mu_){};
  void NoteServedLocked() REQUIRES(mu_) {
    store_version_ = store_->version();
    store_epoch_ = store_->epoch();
    store_digest_ = store_->digest();
  }
  // Relay-only (no store_): the newest version of which the relay holds an
  // object completely, verified.
  uint64_t held_version_ GUARDED_BY(mu_) = 0;
  uint32_t held_epoch_ GUARDED_BY(mu_) = 0;  // held_version_'s board epoch
  // Under mu_: the version this member stands at, as the root, its parents
  // (SUBSCRIBE) and the replay check see it: what it serves, or for a
  // relay-only member what it holds.
  uint64_t VersionLocked() const REQUIRES(mu_) {
    return opt_.relay_only ? held_version_ : store_version_;
  }
  // The board epoch of that version (docs/agent/board.md §4a): the view
  // store's, recorded beside DIR/current (views/state.json), so that a
  // restarted member knows it; relay-only: the held version's manifest's.
  uint32_t ServedEpochLocked() const REQUIRES(mu_) {
    return opt_.relay_only ? held_epoch_ : store_epoch_;
  }
  // The position (epoch, version) this member stands at; positions only go
  // up (a supersede: a higher epoch with a lower number).
  BoardPos PosLocked() const REQUIRES(mu_) { return {ServedEpochLocked(), VersionLocked()}; }
  uint64_t dial_backoff_us_ GUARDED_BY(mu_) = 0;
  bool dial_failed_logged_ GUARDED_BY(mu_) = false;
  // Complete, verified objects waiting to be applied, by target version.
  std::map<uint64_t, std::pair<ObjectRef, std::string>> ready_ GUARDED_BY(mu_);
  // When the relay reported each of them complete (NowS), by target
  // version: the apply's log line says how long it waited for the work
  // thread (a PrepareSpare or another apply), the benchmark's breakdown.
  std::map<uint64_t, double> complete_at_s_ GUARDED_BY(mu_);
  // Objects the relay holds, forgotten once every version they lead to is
  // kKeepVersions behind what this agent serves (the relay's table is
  // bounded: RelayOptions::max_objects).
  std::set<ObjectRef> relay_held_ GUARDED_BY(mu_);
  // Takes what is kept_versions behind `served` out of relay_held_ and
  // returns it for ForgetObjects, which the caller runs once it has let go
  // of mu_: a member's unlink is disk I/O, which the agent's lock should not
  // wait on (the relay's Forget only queues an event for its worker).
  [[nodiscard]] std::vector<ObjectRef> ForgetOldObjectsLocked(uint64_t served,
                                                              uint64_t keep_versions) REQUIRES(mu_);
  // The relay stops holding each (Forget: it keeps a mapping until the last
  // send of it completes, so a child being fed loses nothing); a member's
  // copy is unlinked (the root's objects are the board's: its retention).
  void ForgetObjects(const std::vector<ObjectRef>& refs) EXCLUDES(mu_);
  // Work thread: adopts the seed checkpoint if `m` (verified, its version
  // the seed's) signs its digest; clears seed_pending_ either way.
  void MemberSeed(const VersionManifest& m);
  // Manifests accepted, by version (publication target digests).
  std::map<uint64_t, VersionManifest> manifests_ GUARDED_BY(mu_);
  // Round trips measured with PING/PONG (seconds; 0: not yet): to the root
  // on the control connection, to each parent on a probe connection.
  double rtt_to_root_s_ GUARDED_BY(mu_) = 0;
  struct ParentProbe {
    std::shared_ptr<Connection> conn;
    bool dialing = false;
    uint64_t next_dial_us = 0;  // after a failed dial
    double rtt_s = 0;
  };
  std::map<std::string, ParentProbe> probes_ GUARDED_BY(mu_);  // by parent data address
  // Per stripe: the parent's progress as the relay's link counters show it.
  struct StripeWatch {
    std::string parent_id;
    StallWatch stall;  // stall_watch.h
    uint64_t bad_chunks = 0;
    bool failed_auth = false;  // the relay dropped it for chunks that failed verification
  };
  std::vector<StripeWatch> watch_ GUARDED_BY(mu_);

  // ---- freshness (agent_beacons.cc) ----
  // Root: its term (the etcd leader key's create revision, or its wall
  // time at start), the last beacon's number, when the next is due, and
  // beacons sent (one per member per interval).
  uint64_t beacon_incarnation_ GUARDED_BY(mu_) = 0;
  uint64_t beacon_seq_ GUARDED_BY(mu_) = 0;
  uint64_t next_beacon_us_ GUARDED_BY(mu_) = 0;  // 0: at the next tick (a member joined)
  uint64_t beacons_sent_ GUARDED_BY(mu_) = 0;
  // Member: the beacons accepted and refused, and when the control
  // connection to the root was made (its beacon deadline starts there).
  FreshnessTracker freshness_ GUARDED_BY(mu_){
      FreshnessOptions{opt_.stale_after_ms, opt_.beacon_max_skew_ms, opt_.max_lag_versions}};
  uint64_t root_link_since_us_ GUARDED_BY(mu_) = 0;
};

}  // namespace tern::agent
