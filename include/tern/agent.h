// tern-agent: the transfer agent that runs on every node (docs/agent.md).
//
// A root agent (trainer side) owns the board of immutable versions, signs
// each version's manifest, plans the relay trees (topology/) and feeds them;
// member agents (any node) join it, receive each version from their parent
// in every stripe, forward each verified chunk to their children as it lands,
// apply the version locally and switch DIR/current to it atomically. Members
// that fall behind, are new or come back catch up by the cheapest path the
// board offers. Every byte a member forwards or applies chains up to a
// manifest signed by a key it trusts (docs/security.md).
//
// One Agent object is one daemon; `tern-agent` is a thin CLI around it, and
// tests run many in one process over the loopback transport.
//
// Thread safety: Start/Stop from one thread; Publish, Snapshot and the other
// const queries from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tern/clock.h"
#include "tern/digest.h"
#include "tern/dtype.h"
#include "tern/env.h"
#include "tern/export.h"
#include "tern/log.h"
#include "tern/rank_publish.h"
#include "tern/status.h"
#include "tern/transport.h"

namespace tern {

struct AgentOptions {
  // ---- Role ----
  bool root = false;
  // Member: the root's address (control), e.g. "10.0.0.1:7400"; with a
  // standby root, a comma-separated list, tried in turn.
  std::string join;
  // The address this agent listens on (control and data on one port; the
  // first message of a connection says which it is). Port 0 picks one.
  std::string listen;
  // Admin HTTP (/metrics, /status, and on the root POST /publish); empty:
  // none. Port 0 picks one.
  std::string admin_listen;

  // ---- Identity and place ----
  std::string id;       // unique member id; empty: derived from listen address
  std::string region = "default";
  std::string cluster;  // empty: a cluster of its own
  std::string island;   // engines that share one copy of the weights
  bool may_relay = true;
  // Member: relay and serve nothing (docs/agent.md §4, "Relay-only
  // members"). It joins, is planned interior before serving members
  // (within the region rules), verifies every chunk against the signed
  // manifest and forwards it, and
  // keeps objects only while the relay holds them (the last few versions);
  // it never applies, so it has no view store, no DIR/current and no spare,
  // and never catches up for itself (its children catch up from the root as
  // usual). Its version is the newest it holds an object of completely.
  // Needs may_relay; not with seed_checkpoint; refused on a DIR that
  // serves a view (DIR/current exists).
  bool relay_only = false;
  // Link rates for planning until measured (bytes/s).
  double uplink_bytes_per_s = 1.25e9;
  double downlink_bytes_per_s = 1.25e9;

  // ---- Data and trust ----
  std::string data_dir;  // DIR: DIR/current is the served version
  // Root: the Ed25519 private key (PEM) that signs manifests; generated and
  // stored in DIR/signing-key.pem when empty and none is there.
  std::string signing_key_pem;
  // Members: the publisher's public key(s) (PEM). Required for members.
  // With the root's own signing key: key set 0 (docs/security.md "Key
  // rotation and revocation").
  std::vector<std::string> trusted_keys_pem;
  // Root: the chain of signed key sets (tern/key_set.h), key set 1
  // first, each made by `tern keys rotate`. The root applies them after
  // opening its board (whose records were signed under earlier sets), signs
  // with signing_key_pem, which the last set must list, and sends the chain
  // to every member right after it joins. At most 64.
  std::vector<std::string> key_sets;
  // Shared secret a member presents to join, and a child to its parent; the
  // root and every relay refuse a peer without it. Empty: no token (only for
  // trusted networks; use mutual TLS across untrusted ones).
  std::string join_token;
  // Bearer token for the admin port's mutating routes (POST /publish);
  // empty: none. Init refuses an admin address off loopback with mutating
  // routes and no token (anyone who reaches the port could publish) or no
  // TLS (the token would cross the network in clear) unless admin_insecure
  // says the operator means it (docs/security.md "The admin port").
  std::string admin_token;
  bool admin_insecure = false;
  // Both or neither: the admin port speaks HTTPS only, with this
  // certificate (PEM: the leaf, then intermediates) and its unencrypted
  // key; clients dial https://HOST:PORT.
  std::string admin_tls_cert_pem, admin_tls_key_pem;
  // With TLS: the CA(s) (PEM) that must have signed a client's certificate
  // (mutual TLS, on top of the token); empty: no client certificate asked.
  std::string admin_tls_client_ca_pem;
  // Root, POST /publish only: the checkpoints it may read lie under this
  // directory (symbolic links resolved; the resolved path is what is read).
  // Empty: any path the root can read.
  std::string publish_dir;
  // Root, POST /publish only: a version more than this beyond HEAD is refused
  // unless the request says "force": true. Versions only increase, so one
  // wrong number would hold back every later publish (the way back is a
  // supersede: Agent::Supersede, "supersede": true). 0: no bound.
  uint64_t max_version_jump = 1000000;

  // Members: a checkpoint this node already holds (a safetensors file or
  // directory, e.g. pulled from the trainer's object store) of version
  // `seed_version` of this board. Adopted (copied into the view store) only
  // if its full digest is the one the publisher signed for that version;
  // otherwise dropped with a logged reason, and the member catches up from
  // what it serves. Ignored once the member serves seed_version or newer.
  std::string seed_checkpoint;
  uint64_t seed_version = 0;

  // ---- High availability (root) ----
  // "etcd://HOST:PORT[,HOST:PORT...]/PREFIX": the board's log lives in etcd
  // and roots campaign for leadership there; Start blocks until this root
  // leads (a standby waits), and a root that took over publishes its first
  // version as a keyframe (it does not hold the previous view). Empty: the
  // log is DIR/board and there is one root.
  // "etcds://..." for TLS. Secure by default (docs/agent/etcd.md §1,
  // "Security"): Start refuses an etcd endpoint off loopback that is plain
  // http, or that this root would reach without authenticating (no client
  // certificate, no user), unless etcd_insecure.
  std::string board_etcd;
  uint32_t etcd_lease_s = 3;  // a dead leader is replaced after about this long
  // TLS to etcd, PEM text (tern-agent reads --etcd-cacert, --etcd-cert,
  // --etcd-key): the CA(s) etcd's certificate must chain to (empty: the
  // system's trust store), and our client certificate and key for etcd's
  // --client-cert-auth (both or neither).
  std::string etcd_ca_pem;
  std::string etcd_cert_pem;
  std::string etcd_key_pem;
  // An etcd user (etcd's auth enabled) and its password (tern-agent reads
  // --etcd-password-file); the password is never logged.
  std::string etcd_user;
  std::string etcd_password;
  bool etcd_insecure = false;

  // ---- Policy (root) ----
  uint32_t stripes = 1;
  uint32_t fanout_max = 4;
  uint32_t root_fanout_max = 8;
  uint32_t keep_patches = 16;
  uint32_t keyframe_every = 32;
  uint64_t segment_elements = uint64_t{1} << 20;
  // Patch format the root writes (docs/format/patch.md): 1 or 2 forces it;
  // 0 (auto) chooses per version the one predicted to bring the last member
  // to serve sooner, from the members' measured apply and receive rates
  // (docs/agent.md "Choosing the patch format"). 2 is ~0.7x format 1's
  // bytes; 1 applies 2.7-6x faster per byte of view.
  uint16_t patch_format = 0;
  // Format 2 codes packed 4-bit codes (NVFP4, MXFP4, INT4 in U8/I32
  // tensors) as nibbles where that is smaller; the patch file then says
  // version 3 (docs/format/patch.md). false: every patch stays at version
  // <= 2, for a fleet whose readers predate version 3 (they refuse a
  // version-3 patch as unsupported, they never misread it).
  bool patch_nibbles = true;

  // ---- Timing ----
  // Root: the board's heartbeat period; members take it from WELCOME (a
  // member's own value is used only until it joins).
  uint32_t heartbeat_ms = 500;
  uint32_t dead_after_ms = 3000;  // a member silent this long leaves the plan
  // A member brings its spare view up to the served version this long after
  // each switch (ViewStore::PrepareSpare), off the next version's critical
  // path. The reader rule: a reader of DIR/current must be done with the
  // slot it resolved within this grace after the switch away from it (or
  // before the next version is applied, if that comes sooner), since both
  // rewrite that slot (docs/agent/apply.md).
  uint32_t spare_grace_ms = 2000;
  // Member: a patch from the served version is applied to the prepared
  // spare segment by segment while its chunks arrive (verified, in order),
  // so that its last chunk leaves only the rest, the digest check and the
  // switch (docs/agent/apply.md "Streaming apply"). false: applied whole
  // once complete.
  bool stream_apply = true;
  // Root, for the whole board (members take it from WELCOME; their own
  // value is not used): a member reports a parent that sends no byte for
  // this long while a version is due (HEAD is newer than what it serves
  // or holds), and the root plans around it; 0: no stall reports (chunks
  // that fail verification are reported regardless). The root judges a
  // stall report by the parent's own heartbeats over this long
  // (docs/agent.md §4; 0: that rule off).
  uint32_t parent_stall_ms = 10000;
  // Root: a relay demoted for its children's reports relays again after
  // this long without further reports; each repeat doubles the wait, up to
  // 16 times this; a relay reported for chunks that failed SHA-256 waits
  // the 16 times at once (docs/agent.md §4). 0: a demoted relay stays a
  // leaf until it joins again.
  uint32_t relay_probation_ms = 60000;
  // Member: the standing receive window per parent link into which a parent
  // pushes a new object's first chunks without waiting for WANT
  // (docs/agent/relay.md "Push"); 0: no push. At most 64 MiB.
  uint32_t push_window_bytes = uint32_t{2} << 20;
  // Member: chunk windows open per parent link and object (1..4096), and
  // at most this many bytes of them (at least one window; 0: chunks only).
  // A relay's resident memory while an object passes is its windows plus
  // what each child has asked for (its windows): 64 MiB + 64 MiB per child
  // by default with 4 MiB chunks (objects of 16 MiB and more). Throughput
  // per parent link is at most window_bytes per round trip (64 MiB at
  // 150 ms: ~3.6 Gb/s); lower it for memory, raise it for fast long links
  // (docs/agent/relay.md "Windows").
  uint32_t window_chunks = 16;
  uint64_t window_bytes = uint64_t{64} << 20;

  // ---- Freshness (docs/security.md "Freshness") ----
  // Root: sends every member a signed HEAD beacon this often (1..600000).
  uint32_t beacon_interval_ms = 1000;
  // Member: stale ("cut off") when no valid beacon came for this long; a
  // member also drops its control connection then and dials the root (or
  // the next --join address) again. 1..3600000; keep it several beacon
  // intervals.
  uint32_t stale_after_ms = 5000;
  // Member: a beacon whose root wall time differs from ours by more than
  // this is refused ("clock skew"), so a recorded beacon cannot be replayed
  // to a restarted member long after. 1..86400000.
  uint32_t beacon_max_skew_ms = 30000;
  // Member: stale ("behind") when the signed HEAD is more than this many
  // versions ahead of the version it serves (relay-only: holds).
  uint64_t max_lag_versions = 1;
  // The wall clock (ms since 1970) beacons carry and are checked against;
  // nullptr: the system clock. Tests skew it.
  std::function<uint64_t()> wall_clock_unix_ms;

  // ---- Serving hook (docs/agent/operations.md "Events") ----
  // Run with /bin/sh -c each time this agent serves a new version (a
  // kVersionServed event), on a thread of its own, never the agent's work
  // thread: the event as one JSON object on stdin and in TERN_EVENT_*
  // variables. At most one runs at a time; versions served while it runs
  // are coalesced into one run for the newest. A run past
  // on_serve_timeout_ms is killed (SIGKILL to its process group). Exit
  // statuses are logged and counted (tern_agent_serve_hook_runs_total).
  // Empty: no hook.
  std::string on_serve_command;
  uint32_t on_serve_timeout_ms = 60000;

  // ---- The engine beside a member (docs/engines.md "The agent drives the
  // engine") ----
  // "vllm": load every version this member serves into the vLLM server at
  // engine_url (started from DIR/current with --weight-transfer-config
  // '{"backend": "tern"}' and VLLM_SERVER_DEV_MODE=1), through the tern
  // backend's update routes: pause (engine_pause: keep, wait or abort),
  // update with the tensors that changed, finish with the version, reset
  // the prefix cache (engine_reset_prefix_cache), resume. "sglang": the
  // SGLang server at engine_url (started with --model-path DIR/current):
  // pause_generation, update_weights_from_disk from the slot (every
  // tensor) with the version, flush_cache, continue_generation
  // (docs/engines.md "SGLang"). Empty: none. Members only.
  std::string engine;
  std::string engine_url;  // http://HOST:PORT
  std::string engine_pause = "keep";
  bool engine_reset_prefix_cache = true;
  uint32_t engine_update_timeout_ms = 300000;  // one update call (reads and loads)
  uint32_t engine_attempts = 2;                // update sequences per version before a backoff
  // The tern-sidecar in front of the engine (HOST:PORT; empty: none): every
  // update runs inside a commit it holds open (docs/engines.md "The commit
  // point"), so it never stamps a request with a version it did not run on.
  // engine_sidecar_token: its admin token (--admin-token-file there).
  std::string engine_sidecar;
  std::string engine_sidecar_token;

  // ---- Dependencies (not owned; must outlive the agent) ----
  Transport* transport = nullptr;  // required
  // Optional: the transport for data edges inside this agent's cluster
  // (same region, same non-empty cluster; RDMA there, say, and `transport`
  // — TCP with TLS — for every other edge and for control). The agent
  // listens with it on `listen_intra` too and names that address in HELLO;
  // the root then gives each edge whose two ends both have one the
  // parent's intra address (docs/agent.md §5). Every agent of a cluster
  // must use the same kind. Null: every edge uses `transport`.
  Transport* intra_transport = nullptr;
  std::string listen_intra;        // required with intra_transport; port 0 picks one
  Env* env = nullptr;              // nullptr: DefaultEnv()
  LogFn log;                       // nullptr: stderr
  uint32_t threads = 0;            // apply/diff threads; 0: hardware
};

// One member as the root sees it (or the agent itself).
struct AgentMemberStatus {
  std::string id, region, cluster, island;
  std::string parent;        // stripe 0's parent id
  uint32_t depth = 0;        // edges from the root in stripe 0
  // Serving members: the version DIR/current serves. Relay-only members:
  // the newest version they hold an object of completely.
  uint64_t served_version = 0;
  uint64_t lag = 0;         // HEAD - served_version
  bool relay_only = false;  // serves nothing (AgentOptions::relay_only)
  uint64_t bytes_in = 0, bytes_out = 0, chunk_retries = 0;
  // Measured by the member: round trips (PING/PONG; to the parent: the
  // slowest of its parents), the rate the last object arrived at.
  double rtt_to_parent_s = 0, rtt_to_root_s = 0, rate_in_bytes_per_s = 0, last_apply_s = 0;
  double last_heartbeat_age_s = 0;
  // The best rate its children reported receiving from it (bytes/s; 0: none).
  double measured_uplink_bytes_per_s = 0;
  // Children reported it bad (PARENT_REPORT): the root plans it as a leaf
  // until its probation ends (docs/agent.md §4 "Probation").
  bool demoted = false;
  // An operator drained it (Agent::DrainMember): a leaf until it rejoins.
  bool draining = false;
  std::string demoted_for;  // the last demotion's fault: "stalled", "bad chunks"; empty: none
  uint32_t demotions = 0;   // since it joined (a rejoin starts afresh)
  uint32_t strikes = 0;     // those that count towards its next wait (the policy forgets)
  // Demoted: seconds until it may relay again (0: due at the root's next
  // tick); -1 when not demoted, or demoted with no probation (a leaf until
  // it joins again).
  double relay_again_in_s = -1;
};

// Where the root's publish of one version spent its time, in seconds
// (docs/agent/board.md §4, "The root's publish, in order"). Stages in
// order; 0 for a stage that did not run. offered_s is the latency that
// matters to the tree: from the publish call until the version's objects
// are offered to the root's children and HEAD is sent. The root's own
// apply into DIR/current follows it.
struct AgentPublishSpans {
  // The publisher's lock waited for (a catch-up squash may hold it), the
  // checkpoint opened and mapped, model files stored.
  double prepare_s = 0;
  double verify_prev_s = 0;  // prev's digest checked against HEAD's manifest
  double diff_s = 0;         // diff + encode of the patch, D(prev) hashed in its pass
  double keyframe_s = 0;     // the keyframe's, when one is due
  double hash_s = 0;         // chunk SHA-256 and Merkle roots
  double sign_s = 0;
  double write_s = 0;        // object files written and fsynced
  double record_s = 0;       // the board record and its sync
  // From the record to the offer: the checkpoints released and the agent's
  // lock taken (to note the format chosen), which its other work may hold.
  double handoff_s = 0;
  double announce_s = 0;     // objects offered to the relay, HEAD sent
  double offered_s = 0;      // call -> offered and announced (the sum so far)
  double apply_s = 0;        // the root's own apply into DIR/current
  double retain_s = 0;       // retention of objects and model files
  double total_s = 0;        // call -> return
};

struct AgentVersionStatus {
  uint64_t version = 0;
  uint64_t patch_bytes = 0;      // 0 for the first version
  uint64_t keyframe_bytes = 0;   // 0 when none was made
  uint64_t view_bytes = 0;       // the full serve view
  double published_at_s = 0;     // agent clock
  double first_served_s = -1;    // after publish; -1: nobody yet
  double last_served_s = -1;     // when every member known at publish served it
  // The format of its objects (1 or 2; 0: not chosen by this root, e.g. a
  // version assembled from ranks' parts) and why (docs/agent.md "Choosing
  // the patch format"): "format 1: predicted 0.8 s vs 1.3 s; apply-bound on m3".
  uint16_t patch_format = 0;
  std::string format_reason;
  // The model's predictions for formats 1 and 2 (-1: not predicted).
  double predicted_f1_s = -1, predicted_f2_s = -1;
  AgentPublishSpans publish;     // the root's publish of it
};

// Freshness from the root's signed HEAD beacons (docs/security.md
// "Freshness"). A member is fresh when it accepted a beacon within
// stale_after_ms whose HEAD is at most max_lag_versions ahead of what it
// serves; stale otherwise, for the reason given.
struct AgentFreshness {
  bool stale = false;
  // Empty when fresh; "no beacon yet", "cut off" (no valid beacon for
  // stale_after_ms), "clock skew" (cut off, the last signed beacons refused
  // for skew), "behind" (the signed HEAD past the lag bound).
  std::string stale_reason;
  double last_beacon_age_s = -1;  // -1: none accepted
  uint64_t beacon_head = 0;       // the last accepted beacon's HEAD (root: its HEAD)
  uint64_t lag_versions = 0;      // beacon_head - the version it serves, 0 when not ahead
  uint64_t incarnation = 0;       // the root's term (root: its own)
  uint64_t seq = 0;               // the last accepted (root: sent) beacon's number
  std::string root_id;
  // The root's wall time minus ours at the last validly signed beacon.
  int64_t clock_skew_ms = 0;
  bool clock_skew_exceeded = false;
  // Member: beacons received, by verdict (agent/freshness/freshness.h):
  // forged = a trusted key id whose signature does not verify; untrusted =
  // a key not trusted now (not learned yet, revoked, expired by our clock).
  // Root: beacons sent (all members).
  uint64_t beacons_accepted = 0, beacons_malformed = 0, beacons_forged = 0, beacons_untrusted = 0,
           beacons_foreign = 0, beacons_replayed = 0, beacons_skewed = 0;
  uint64_t beacons_sent = 0;
};

// The engine a member drives (AgentOptions::engine); absent without one.
struct AgentEngineStatus {
  std::string engine;           // "vllm" or "sglang"
  uint64_t version = 0;         // the version the engine says it serves (0: none known)
  // The board epoch of `version` (docs/agent/board.md §4a): the one the
  // member served it in when the engine loaded it. 0 also when not known
  // (an engine found serving a number the member did not give it). The
  // engine's own status names no epoch; with it, (epoch, version) tells a
  // withdrawn number from a new one below or above it.
  uint32_t epoch = 0;
  uint64_t target_version = 0;  // the newest version the member served for it
  uint32_t target_epoch = 0;    // and its epoch
  // "starting", "serving", "updating", "waiting" (the slot moved on),
  // "failed" (retrying after a backoff), "unreachable"
  std::string state;
  std::string last_error;
  uint64_t updates_ok = 0, updates_failed = 0;
  int64_t last_pause_ms = -1;   // the last update's pause -> resume, as the engine saw it
  int64_t last_update_ms = -1;  // its update call (read + load)
  bool last_full = false;       // it loaded every tensor
};

struct AgentSnapshot {
  bool root = false;
  std::string id;
  std::string listen_address;  // the bound address
  std::string intra_address;   // the intra transport's bound address (empty: none)
  std::string admin_address;   // the bound admin address (empty: none; "https://HOST:PORT" with TLS)
  uint64_t head = 0;           // root: HEAD; member: the newest it knows
  uint64_t served_version = 0;  // 0 for a relay-only member (it serves nothing)
  // Board epochs (docs/agent/board.md §4a; 0 until the first supersede):
  // HEAD's (member: of the newest HEAD it knows) and the served version's
  // (relay-only: the held version's). served_epoch < head_epoch: the member
  // serves a withdrawn version until it re-bases.
  uint32_t head_epoch = 0;
  uint32_t served_epoch = 0;
  ViewDigest served_digest;
  bool relay_only = false;
  // Relay-only: the newest version it holds an object of completely (what
  // it reports to the root as its version); others: served_version.
  uint64_t held_version = 0;
  std::vector<AgentMemberStatus> members;   // root only
  std::vector<AgentVersionStatus> versions; // root only, newest last
  std::string parent;                       // member: stripe 0's parent id
  bool joined = false;
  AgentFreshness freshness;
  bool has_engine = false;
  AgentEngineStatus engine;  // with has_engine
  // The agent's own lock (docs/agent/operations.md "The agent's lock"):
  // every hold of kSlowAgentLockHoldMs or more, since the agent started.
  struct LockHolds {
    uint64_t slow_holds = 0;
    double longest_s = 0;    // 0: none
    double longest_cpu_s = 0;  // of longest_s, the holder on a CPU (the rest: preempted or blocked)
    std::string longest_at;  // where it was taken: "agent_root.cc:812 PublishViewLocked"
  } lock;
};

// A hold of the agent's lock this long or longer is logged and counted: the
// lock serializes the agent's control work (heartbeats, offers, /status), so
// every other thread that needs it waited as long.
inline constexpr uint32_t kSlowAgentLockHoldMs = 100;

// Something that happened at an agent, in the order it happened there
// (docs/agent/operations.md "Events"). seq numbers an agent's events
// consecutively from 1 (per process run); at_s is the agent's clock.
struct AgentEvent {
  enum class Kind : uint8_t {
    kVersionPublished = 1,  // root: `version` is on the board
    kVersionServed = 2,     // DIR/current now serves `version` (a member; the root after publishing)
    kMemberJoined = 3,      // root: `member` joined (or came back)
    kMemberLeft = 4,        // root: `member` said goodbye
    kMemberFailed = 5,      // root: `member` went silent past dead_after_ms
    kMemberDemoted = 6,     // root: `member` relays no more until its probation ends
    kMemberDrained = 7,     // root: an operator drained `member` (Agent::DrainMember)
    kMemberRemoved = 8,     // root: an operator removed `member` (Agent::RemoveMember)
  };
  uint64_t seq = 0;
  double at_s = 0;
  Kind kind = Kind::kVersionServed;
  uint64_t version = 0;     // published / served (0 for membership events)
  // The board epoch of `version` (docs/agent/board.md §4a; 0 until the
  // first supersede, and for membership events): (epoch, version) only
  // goes up from one version event to the next.
  uint32_t epoch = 0;
  ViewDigest digest;        // D(version) (zero for membership events)
  std::string member;       // membership events: the member's id; others: this agent's
  // kVersionServed: the slot directory DIR/current pointed at when the
  // version was switched in (DIR/views/a or /b: stable while it is served;
  // the reader rule of docs/agent/apply.md applies once it is not).
  std::string slot_dir;
  // kVersionServed: true when the whole view is new (a keyframe, a seed,
  // the first version); else changed_tensors names every tensor whose bytes
  // the patch changed, sorted (a tensor the patch does not touch is not
  // listed). kVersionPublished: the same, from the root's diff.
  bool all_tensors = false;
  std::vector<std::string> changed_tensors;

  bool operator==(const AgentEvent&) const = default;  // every field
};
// "version_served", ...; "unknown" for a kind this build does not know (an
// event parsed from a newer agent's GET /events keeps it as Kind 0).
TERN_EXPORT const char* AgentEventKindName(AgentEvent::Kind kind);

// One GET /events answer, parsed (PollAgentEvents; docs/agent/operations.md
// "Events").
struct AgentEventPoll {
  std::vector<AgentEvent> events;  // oldest first, seq ascending
  uint64_t gap = 0;                // events after after_seq the agent's ring no longer held
  bool restarted = false;          // seqs at or below after_seq: the agent's seqs began again
  uint64_t next = 0;               // the after_seq of the next poll
  uint64_t last_seq = 0;           // the agent's newest seq
  // The agent process's run: seqs number events per run, so a poll that
  // sees another run than the last one missed the new run's first events
  // when that run had already numbered past after_seq (poll from 0).
  // "" from an agent older than this field.
  std::string run;
};

// One tensor of a serve view in the caller's memory (Agent::PublishTensors):
// the exact bytes an engine serves, contiguous and row-major, in host memory.
// Borrowed for the call only: the agent reads them while it diffs and
// encodes and keeps no pointer afterwards.
struct PublishTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;  // empty: a scalar
  const void* data = nullptr;   // `bytes` bytes; may be null only when bytes is 0
  uint64_t bytes = 0;           // must be DTypeBytes(dtype, product of shape)
};

// PublishTensors' bounds: tensors per version, bytes of a name, dimensions.
inline constexpr size_t kMaxPublishTensors = 1'000'000;
inline constexpr size_t kMaxPublishTensorName = 4096;
inline constexpr size_t kMaxPublishTensorRank = 8;

// D(view) of a whole serve view held in the caller's memory: what an engine
// that applied a version in place checks against the version's signed
// digest (the manifest binds it: docs/security.md). Every tensor of the view,
// each once, any order; checked as PublishTensors checks them, errors
// prefixed "view_digest". Reads the bytes in place on up to `threads`
// threads (0: one per core, at most 8). Thread safety: a pure function.
TERN_EXPORT Result<ViewDigest> DigestOfTensors(const std::vector<PublishTensor>& tensors,
                                               unsigned threads = 0);

class TERN_EXPORT Agent {
 public:
  // Opens DIR (recovering the board and the served version), listens, and
  // for a member starts joining (in the background: a root that is not up
  // yet is retried with backoff).
  static Result<std::unique_ptr<Agent>> Start(const AgentOptions& options);
  virtual ~Agent() = default;

  // Root only: diffs `checkpoint_path` against the previous version,
  // signs, stores and starts feeding the trees. `version` must be newer
  // than HEAD. Returns when the version is on the board (durable), before
  // members have it.
  virtual Status Publish(const std::string& checkpoint_path, uint64_t version) = 0;
  // Root only: the recovery from a wrong version number (docs/agent/board.md
  // §4a, docs/agent/operations.md "Recovering from a wrong version"):
  // publishes `checkpoint_path` as `version` *below* HEAD, opening the next
  // board epoch; HEAD and the versions above `version` are withdrawn, and
  // members move to it by the backwards patch(HEAD -> version). The root
  // must serve HEAD's view. Refused, changing nothing: `version` not below
  // HEAD or 0, or a number the board holds (kAlreadyExists), an empty board
  // (kInvalidArgument).
  virtual Status Supersede(const std::string& checkpoint_path, uint64_t version) = 0;

  // Root only, for schedulers (docs/agent/operations.md "Draining and
  // removing members"). DrainMember: `id` relays for nobody from now on —
  // its children move to other parents at once (only they are told) — and
  // stays a leaf while it is joined; it keeps receiving and serving. Drain a
  // member before taking it away and its departure moves nobody.
  // RemoveMember: drops `id` now, as if it had gone silent (its children
  // re-attached, its connection closed, kMemberRemoved) without waiting
  // for dead_after_ms, and refuses its joins for rejoin_after_ms (at most
  // 86400000; 0: it may rejoin at once). Both: kNotFound for an id that is
  // not joined (RemoveMember of an absent id still starts the refusal, so a
  // scheduler may remove a member that is reconnecting).
  virtual Status DrainMember(const std::string& id) = 0;
  virtual Status RemoveMember(const std::string& id, uint32_t rejoin_after_ms) = 0;
  // Root only: retention while running (AgentOptions::keep_patches and
  // keyframe_every; both >= 1, else kInvalidArgument): later publications
  // and the next retention pass follow it.
  virtual Status SetRetention(uint32_t keep_patches, uint32_t keyframe_every) = 0;
  // Root only: key rotation while running (docs/agent/operations.md
  // "Rotating and revoking the publisher key"). `signed_key_set` (from
  // `tern keys rotate`; empty: none) must be the next key set of the chain;
  // `signing_key_pem` (empty: keep the current key) is the private key to
  // sign with from now on. Whatever is given, the signing key must be an
  // active, unexpired key of the resulting set, or nothing changes
  // (kMismatch, naming the key id). Applied between publications: the key
  // set is kept in DIR/key-sets and sent to every member before anything
  // is signed with the new key; a key read from DIR/signing-key.pem is
  // replaced there, so a restart keeps signing with it.
  virtual Status RotateKeys(std::string_view signed_key_set, std::string_view signing_key_pem) = 0;
  // Root only: Publish from memory. `tensors` (in any order) are the whole
  // serve view of `version`; the agent diffs them against the view it
  // serves (DIR/current, mapped from its slot: never a checkpoint file
  // re-read), signs, stores and feeds the trees exactly as Publish does, and
  // the root's DIR/current then serves the new view (applied from the
  // patch, or installed from the keyframe for the first version). The
  // version carries no model files (config.json etc.): a member's slot
  // keeps the ones it has. Refused before anything is written, with one
  // message naming the tensor (kInvalidArgument): an empty or duplicate
  // name, a null pointer, `bytes` that are not the dtype and shape's size,
  // a shape whose size overflows; once a version is served (kMismatch) a
  // tensor the served layout lacks, one it has that is missing, or another
  // dtype or shape than it serves (a layout is fixed by the first version).
  // Thread safety: as Publish (one publish at a time; a second waits).
  virtual Status PublishTensors(uint64_t version, const std::vector<PublishTensor>& tensors) = 0;

  // Root only: one trainer rank's part of a version (tern/rank_publish.h:
  // the rank's RankPublisher::Encode). The parts of part.version are
  // gathered until each of part.world_size ranks sent one, then joined
  // (AssembleRankParts: disjoint shards covering the layout, digest terms
  // adding up to D(HEAD) and to the target) and committed as one version,
  // served by the root itself and fed to the trees as any other; the root
  // never sees the full weights. Every caller of that version returns with
  // the one outcome: Ok once it is on the board (then call Committed() on
  // the rank's publisher; on an error, Abandon()).
  //
  // The first part of a version starts its deadline, timeout_ms
  // (1..600000) from then: parts missing at the deadline fail it, nothing
  // is published, and every waiting rank gets kTimeout naming the missing
  // ranks. A part of another version while one is gathered is refused
  // (kUnavailable); an unknown rank, a second part of a rank, or a world
  // size other than the first part's kInvalidArgument, at once and for that
  // caller only. The root must serve HEAD (not so for a root that took the
  // board over until it publishes from a checkpoint or memory: kUnavailable).
  // A late keyframe is made after the commit when the policy says so.
  // Before anything is signed, each rank's records are applied to a scratch
  // copy of the segments they touch and checked against the digest deltas
  // the rank claims: a rank that lies fails the version (kMismatch, naming
  // the rank). Ranks in other processes reach this through POST
  // /publish/rank-part (SendRankPart).
  // Thread safety: any threads at once (one per rank).
  virtual Status PublishRankPart(RankPart part, uint32_t timeout_ms) = 0;

  virtual AgentSnapshot Snapshot() const = 0;
  // The public key members must trust (root), PEM.
  virtual std::string PublicKeyPem() const = 0;

  // The agent's events with seq > after_seq, oldest first, at most
  // max_events (1 .. 1024); when there are none yet, waits up to
  // timeout_ms (at most 600000) for the first and returns Ok with `out`
  // empty if none came. The agent keeps its last 1024 events (a ring): when
  // out's first seq is above after_seq + 1, the events in between were
  // dropped (a gap: the caller missed them, e.g. re-reads DIR/current).
  // after_seq 0 asks for everything held; an after_seq beyond the agent's
  // last seq (the caller outlived a restart: seqs begin at 1 again) is
  // taken as 0. A zero timeout never waits. kResourceExhausted when 64
  // callers already wait; kUnavailable once the agent is stopping (waiters
  // wake at once). Thread-safe. Events: docs/agent/operations.md "Events".
  virtual Status WaitEvents(uint64_t after_seq, size_t max_events, uint32_t timeout_ms,
                            std::vector<AgentEvent>* out) = 0;

  // Leaves (members say so to the root), closes every connection, joins
  // every thread. Idempotent; the destructor calls it.
  virtual void Stop() = 0;
};

// ---- Talking to an agent's admin port (tern publish / tern status, and
// schedulers that embed tern) ----
//
// admin_address: "HOST:PORT" or "http://HOST:PORT" (plain HTTP), or
// "https://HOST:PORT" (TLS; the certificate is verified against
// AgentClientOptions::ca_pem and must name HOST: kAuth when it does not).

struct AgentClientOptions {
  std::string token;            // bearer token for mutating requests
  // For an "https://HOST:PORT" admin address: the CA(s) (PEM) that signed
  // the agent's admin certificate; empty: the system's trust store.
  std::string ca_pem;
  // For an agent whose admin port requires a client certificate
  // (AgentOptions::admin_tls_client_ca_pem): ours and its unencrypted key
  // (PEM), both or neither.
  std::string cert_pem, key_pem;
  uint32_t timeout_ms = 600000;
  bool force = false;  // PublishToRoot: a version far beyond HEAD is meant (max_version_jump)
  // PublishToRoot: a supersede (Agent::Supersede): `version` below HEAD
  // opens the next board epoch; the recovery from a wrong version number.
  bool supersede = false;
};

// POST /publish to a root's admin port: the root diffs `checkpoint_path`
// (a path the root can read) against HEAD and publishes it as `version`.
// Returns once the version is on the board, however long the publish takes
// (it polls the root's GET /publish: docs/agent/operations.md); kTimeout when
// options.timeout_ms passes first while the root is still publishing. Errors
// carry the root's code and reason (kAuth for a bad token, kInvalidArgument
// for a stale version, kUnavailable when the root cannot be reached).
TERN_EXPORT Status PublishToRoot(const std::string& admin_address, const std::string& checkpoint_path,
                                 uint64_t version, const AgentClientOptions& options = {});
// GET /status: the agent's snapshot as JSON text (docs/agent/operations.md).
TERN_EXPORT Result<std::string> AgentStatusJson(const std::string& admin_address,
                                                const AgentClientOptions& options = {});
// GET /metrics: the agent's metrics in Prometheus text (docs/agent/operations.md).
TERN_EXPORT Result<std::string> AgentMetricsText(const std::string& admin_address,
                                                 const AgentClientOptions& options = {});
// GET /publish (a root): its last publish jobs as JSON text,
// {"jobs": [{"version", "checkpoint", "state", "seconds", "code", "error"}]}.
TERN_EXPORT Result<std::string> AgentPublishJobsJson(const std::string& admin_address,
                                                     const AgentClientOptions& options = {});

// GET /events?after=..&max=..&timeout_ms=..: the agent's events after
// `after_seq` as JSON text, a long poll of up to `timeout_ms` (at most 5000)
// (docs/agent/operations.md "Events"). Sends the token (the route needs it
// when the agent has one).
TERN_EXPORT Result<std::string> AgentEventsJson(const std::string& admin_address, uint64_t after_seq,
                                                uint32_t max_events, uint32_t timeout_ms,
                                                const AgentClientOptions& options = {});

// GET /events as AgentEvents: AgentEventsJson parsed (agent/daemon/event_json.h
// says what is checked; a reply that breaks a rule is kProtocol).
TERN_EXPORT Result<AgentEventPoll> PollAgentEvents(const std::string& admin_address,
                                                   uint64_t after_seq, uint32_t max_events,
                                                   uint32_t timeout_ms,
                                                   const AgentClientOptions& options = {});

// Follows an agent's events over its admin port, as a scheduler or a
// process beside an engine does (tern_client_subscribe runs one on its
// thread; docs/agent/operations.md "Events"). Each Next() is one long poll
// of GET /events after the events it returned before. An agent that cannot
// be reached (kUnavailable: nobody listening, a restart, its listeners busy;
// kTimeout) answers no events once a backoff has passed (backoff_min_ms,
// doubling to backoff_max_ms, back to the minimum after an answer). An
// agent that answers with another run than before is a new process whose
// seqs began again: it is followed from its first event (the poll is made
// again from 0), so no event of the new run is skipped even when that run
// numbered past the last seq read before the restart. Any other error
// (kAuth, kProtocol, kInvalidArgument) is returned: following it again
// would fail again.
//
// Thread safety: one thread at a time; `cancel` may be set from any.
class TERN_EXPORT AgentEventFollower {
 public:
  struct Options {
    uint32_t poll_ms = 1000;   // each long poll, at most 5000 (the port's bound)
    uint32_t max_events = 64;  // per poll, 1..1024
    uint32_t backoff_min_ms = 100;
    uint32_t backoff_max_ms = 2000;
  };
  AgentEventFollower(std::string admin_address, AgentClientOptions client, uint64_t after_seq,
                     Options options);
  AgentEventFollower(std::string admin_address, AgentClientOptions client, uint64_t after_seq = 0)
      : AgentEventFollower(std::move(admin_address), std::move(client), after_seq, Options()) {}

  // The next events, oldest first (none when the poll timed out, the agent
  // could not be reached, or `cancel` was set during the backoff).
  Result<std::vector<AgentEvent>> Next(const std::atomic<bool>& cancel);
  uint64_t after_seq() const { return after_seq_; }
  const std::string& run() const { return run_; }  // the last answer's ("" before one)

 private:
  const std::string address_;
  const AgentClientOptions client_;
  const Options options_;
  uint64_t after_seq_;
  std::string run_;
  uint32_t backoff_ms_;
};

// POST /members/drain, /members/remove, /retention on a root's admin port
// (Agent::DrainMember, RemoveMember, SetRetention; docs/agent/operations.md
// "Draining and removing members"). Need the token when the root has one.
// Errors carry the root's code (kNotFound for a member that is not joined).
TERN_EXPORT Status DrainMemberAt(const std::string& admin_address, const std::string& member_id,
                                 const AgentClientOptions& options = {});
TERN_EXPORT Status RemoveMemberAt(const std::string& admin_address, const std::string& member_id,
                                  uint32_t rejoin_after_ms, const AgentClientOptions& options = {});
TERN_EXPORT Status SetRetentionAt(const std::string& admin_address, uint32_t keep_patches,
                                  uint32_t keyframe_every, const AgentClientOptions& options = {});

// POST /keys/rotate on a root's admin port (Agent::RotateKeys): the signed
// key set travels (it is public); the new signing key does not: it is a
// path on the root's machine (`signing_key_file`, empty: keep the key),
// read there. Needs the token when the root has one.
TERN_EXPORT Status RotateKeysAt(const std::string& admin_address, std::string_view signed_key_set,
                                const std::string& signing_key_file, const AgentClientOptions& options = {});

// POST /publish/rank-part to a root's admin port (ABI 1.2 of the C API;
// docs/agent/operations.md "Publishing from trainer ranks"): the rank's
// encoded part (EncodeRankPart) for Agent::PublishRankPart on the root,
// whose gathering deadline is gather_timeout_ms. Returns the version's one
// outcome, however long the root gathers and publishes (it polls GET
// /publish/rank-part); kTimeout when options.timeout_ms passes first.
TERN_EXPORT Status SendRankPart(const std::string& admin_address, const std::vector<uint8_t>& part,
                                uint64_t version, uint32_t rank, uint32_t gather_timeout_ms,
                                const AgentClientOptions& options = {});
// The same for a rank that restarted mid-version (RankPublisher::Resume
// made its part): POST /publish/rank-part?resume=1. The root takes it only
// into the open gathering of `version`, at the other parts' base version;
// its refusal (the version closed, another part of this rank there, a
// wrong base) is kMismatch, its message saying what to do, and changes
// nothing at the root. The same bytes sent before the restart are answered
// with their job's outcome.
TERN_EXPORT Status ResumeRankPart(const std::string& admin_address,
                                  const std::vector<uint8_t>& part, uint64_t version, uint32_t rank,
                                  uint32_t gather_timeout_ms,
                                  const AgentClientOptions& options = {});

// A trainer rank whose process restarted rebuilds its previous view from
// the root (docs/agent/operations.md "Publishing from trainer ranks"):
// reads the root's HEAD from GET /status and fills `publisher` (a new one,
// that has committed nothing: RankPublisher::ResumeFrom) with this rank's
// shards of that version, fetched with GET /view/rows in pieces of at most
// 8 MiB straight into its previous view (the token is needed: they are
// the model's bytes). Returns that version: 0 on an empty board (the
// publisher keeps its zero view). After it the publisher encodes and
// sends the next version as usual, or resumes the version the root is
// gathering (ResumeRankPart). A version published while the pieces are
// fetched starts the fetch again at the new HEAD (kMismatch after four
// tries); a root busy publishing is asked again until options.timeout_ms
// (kTimeout), as is a root applying HEAD to its own view; kUnavailable
// when it serves another version than HEAD until then (it took the board
// over and has published nothing since: read the base from a member's
// slot and Resume). A failure leaves
// the publisher as it was. The root checks the bytes against its digest
// when the part arrives, as it does every base.
TERN_EXPORT Result<uint64_t> FetchRankBase(const std::string& admin_address,
                                           RankPublisher& publisher,
                                           const AgentClientOptions& options = {});

// The JSON text GET /status serves for `snapshot` (an in-process agent's
// Snapshot(), for embedders that run no admin port).
TERN_EXPORT std::string AgentSnapshotJson(const AgentSnapshot& snapshot);

}  // namespace tern
