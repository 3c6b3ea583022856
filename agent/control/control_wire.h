// The agent's control messages: a member and the root talk over one
// long-lived connection (join, heartbeats, parent assignments, HEAD
// announcements, signed HEAD beacons, key sets, catch-up plans, leave). Byte layout:
// docs/format/agent.md ("Control messages"). The data plane (objects parent -> child) has its own
// messages (agent/relay/data_wire.h) in type range 0x40-0x7F; control uses 0x01-0x3F.
//
// Contract: DecodeControl takes untrusted bytes and returns exactly one
// well-formed message or kCorrupt naming what is wrong (unknown type, a
// length past its bound, trailing bytes, a non-finite rate); it never
// crashes. EncodeControl writes what DecodeControl reads back equal.
//
// Thread safety: values and reentrant functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "agent/freshness/beacon.h"
#include "tern/key_set.h"
#include "agent/manifest/object_ref.h"
#include "tern/status.h"
#include "tern/version_manifest.h"

namespace tern::agent {

// 2: HEARTBEAT gained rtt_to_root_s; PING, PONG, PARENT_REPORT.
// 3: HELLO's member gained intra_address, PARENTS' entries `intra`.
// 4: HELLO's member gained intra_backend and relay_only.
// 5: BEACON (signed HEAD beacons, root -> member).
// 6: KEY_SETS (the chain of signed key sets, root -> member).
// 7: HEARTBEAT gained the apply rate per patch format.
// 8: WELCOME gained parent_stall_ms; members keep the root's timing.
// 9: HEARTBEAT gained wire_bytes_in (the root's mid-chunk excuse).
inline constexpr uint16_t kControlProtocol = 9;
inline constexpr size_t kMaxControlIdBytes = 256;       // ids, regions, addresses
inline constexpr size_t kMaxControlTokenBytes = 1024;   // join tokens
inline constexpr size_t kMaxControlTextBytes = 4096;    // reasons
inline constexpr size_t kMaxControlManifestBytes = 64 * 1024;
inline constexpr uint32_t kMaxControlManifests = 64;
inline constexpr uint32_t kMaxControlObjects = 4096;
inline constexpr uint32_t kMaxControlParents = 8;  // stripes (topology::kMaxStripes)
inline constexpr uint32_t kMaxControlKeySets = 64;

enum class ControlType : uint8_t {
  kHello = 0x01,           // member -> root: who I am, what I serve, my credentials
  kWelcome = 0x02,         // root -> member: joined; the board and its HEAD
  kReject = 0x03,          // root -> member: not joined, why (then the root closes)
  kHeartbeat = 0x04,       // member -> root: progress and link figures
  kParents = 0x05,         // root -> member: where to receive each stripe from
  kHead = 0x06,            // root -> member: a new HEAD and its signed manifest
  kCatchUpRequest = 0x07,  // member -> root: I hold `have`, I want `target`
  kCatchUpReply = 0x08,    // root -> member: the objects to fetch, in apply order
  kLeave = 0x09,           // member -> root: leaving on purpose
  kPing = 0x0A,            // any -> agent: echo this nonce (round-trip time)
  kPong = 0x0B,            // the echo of a PING
  kParentReport = 0x0C,    // member -> root: my parent in a stripe is bad
  kBeacon = 0x0D,          // root -> member: a signed HEAD beacon, every beacon interval
  kKeySets = 0x0E,         // root -> member: the chain of signed key sets, after WELCOME
};

struct MemberInfo {
  std::string id;            // 1..kMaxControlIdBytes
  std::string region;        // 1..
  std::string cluster;       // 0..
  std::string island;        // 0..
  std::string data_address;  // where its children connect (1..)
  // Where children in its own cluster connect with the intra-cluster
  // transport (AgentOptions::intra_transport); empty: none, every child
  // uses data_address (0..kMaxControlIdBytes).
  std::string intra_address;
  // The intra-cluster transport's backend, as it runs after any fallback
  // (Transport::name(): "verbs", "ucx", "tcp", "tcp+tls"); the root gives an
  // edge the intra transport only when both ends name the same one. Empty
  // exactly when intra_address is (0..kMaxControlIdBytes).
  std::string intra_backend;
  bool may_relay = true;
  double uplink_bytes_per_s = 0;    // finite, >= 0 (0: unknown)
  double downlink_bytes_per_s = 0;  // finite, >= 0
  // Relays and serves nothing (AgentOptions::relay_only): the planner makes
  // it interior first, and its version is the newest it holds completely.
  // On the wire right after may_relay.
  bool relay_only = false;
  bool operator==(const MemberInfo&) const = default;
};

struct Hello {
  uint16_t protocol = kControlProtocol;
  MemberInfo member;
  BoardId board_id{};           // all zero: a member that never joined
  uint64_t served_version = 0;  // 0: nothing yet
  std::string join_token;       // 0..kMaxControlTokenBytes
  bool operator==(const Hello&) const = default;
};

struct Welcome {
  BoardId board_id{};
  uint64_t head = 0;
  // The board's timing, the root's flags, whatever the members' own say:
  // members tick twice per heartbeat_ms (a HEARTBEAT each tick) and report
  // a parent that brings no byte for parent_stall_ms, or no whole chunk for
  // twice that (0: never).
  uint32_t heartbeat_ms = 0;     // 1..
  uint32_t stripes = 1;          // 1..8
  uint32_t parent_stall_ms = 0;  // protocol 8
  // Where catch-up objects are fetched from (the root's object service);
  // empty: none (catch-up unavailable).
  std::string fetch_address;
  bool operator==(const Welcome&) const = default;
};

struct Reject {
  std::string reason;  // 0..kMaxControlTextBytes
  bool operator==(const Reject&) const = default;
};

// A member's figures for its parent in one stripe.
struct ParentFigures {
  double rtt_s = 0;                // finite, >= 0 (0: not measured)
  double rate_in_bytes_per_s = 0;  // the last object's rate from it, finite, >= 0
  bool operator==(const ParentFigures&) const = default;
};

struct Heartbeat {
  uint64_t seq = 0;
  uint64_t served_version = 0;
  uint64_t receiving_version = 0;  // 0: idle
  uint64_t bytes_in = 0, bytes_out = 0;  // totals since start
  uint64_t chunk_retries = 0;
  double rtt_to_parent_s = 0;       // finite, >= 0 (0: unknown)
  double rate_in_bytes_per_s = 0;   // the last transfer's rate, finite, >= 0
  double last_apply_s = 0;          // finite, >= 0
  double rtt_to_root_s = 0;         // finite, >= 0 (0: unknown)
  std::vector<ParentFigures> parents;  // per stripe, stripe order, 0..kMaxControlParents
  // Bytes of view per second of this member's recent patch applies in
  // format 1 and format 2 (the part after the last byte arrived; 0: none
  // measured): what the root chooses each version's format from
  // (agent/membership/format_choice.h). Finite, >= 0.
  double apply_f1_bytes_per_s = 0;
  double apply_f2_bytes_per_s = 0;
  // Chunk bytes the transport has taken off this member's parent links as
  // open now, whole chunks or not (LinkStats::wire_bytes_in; may drop when
  // a link is dialled again; 0 where the backend does not count): a relay
  // still receiving its first whole chunk of a slow object shows progress
  // here before bytes_in moves (protocol 9; ReportParent's relative rule).
  uint64_t wire_bytes_in = 0;
  bool operator==(const Heartbeat&) const = default;
};

struct ParentRef {
  uint32_t stripe = 0;
  std::string id;            // the parent's member id (the root's own id for the root)
  std::string data_address;  // 1..
  // The edge stays inside one cluster and both ends have an intra-cluster
  // transport: data_address is the parent's intra address, dialled with
  // the member's intra transport.
  bool intra = false;
  bool operator==(const ParentRef&) const = default;
};

struct Parents {
  uint64_t epoch = 0;  // increases with every plan change the member sees
  std::vector<ParentRef> parents;  // one per stripe, stripe order, 1..8
  bool operator==(const Parents&) const = default;
};

struct Head {
  uint64_t head = 0;
  std::string signed_manifest;  // the publication manifest of `head`
  bool operator==(const Head&) const = default;
};

struct CatchUpRequest {
  uint64_t have = 0;    // 0: nothing
  uint64_t target = 0;  // > have; == have (> 0): have's manifest only
  bool operator==(const CatchUpRequest&) const = default;
};

struct CatchUpReply {
  uint64_t target = 0;
  std::vector<std::string> signed_manifests;  // covering every object, 1..64
  std::vector<ObjectRef> objects;             // apply order, 0..kMaxControlObjects
  bool operator==(const CatchUpReply&) const = default;
};

struct Leave {
  bool operator==(const Leave&) const = default;
};

// Round-trip probes. A member PINGs the root on its control connection and
// each parent on a probe connection (a control connection whose first
// message is PING, which every agent answers); the nonce is the sender's
// own clock, so the echo alone gives the round trip.
struct Ping {
  uint64_t nonce = 0;
  bool operator==(const Ping&) const = default;
};
struct Pong {
  uint64_t nonce = 0;  // the PING's
  bool operator==(const Pong&) const = default;
};

enum class ParentFault : uint8_t {
  kStalled = 1,    // no bytes from it for the stall time while a version was due
  kBadChunks = 2,  // chunks that failed SHA-256 against the signed hashes
};
const char* ParentFaultName(ParentFault f);

// A member asks the root to plan around its parent in one stripe.
struct ParentReport {
  uint32_t stripe = 0;    // < kMaxControlParents
  std::string parent_id;  // 1..kMaxControlIdBytes: the parent it was given
  ParentFault fault = ParentFault::kStalled;
  bool operator==(const ParentReport&) const = default;
};

// The root's signed HEAD beacon (agent/freshness/beacon.h), opaque here:
// the member verifies it (freshness.h).
struct Beacon {
  std::string signed_beacon;  // 1..kMaxSignedBeaconBytes
  bool operator==(const Beacon&) const = default;
};

// The root's chain of signed key sets (tern/key_set.h), key set 1
// first, opaque here: the member applies them in order.
struct KeySets {
  std::vector<std::string> signed_key_sets;  // 1..kMaxControlKeySets, each 1..kMaxSignedKeySetBytes
  bool operator==(const KeySets&) const = default;
};

using ControlMessage = std::variant<Hello, Welcome, Reject, Heartbeat, Parents, Head,
                                    CatchUpRequest, CatchUpReply, Leave, Ping, Pong, ParentReport,
                                    Beacon, KeySets>;

ControlType TypeOf(const ControlMessage& m);
const char* ControlTypeName(ControlType t);

Result<std::string> EncodeControl(const ControlMessage& m);
Result<ControlMessage> DecodeControl(std::string_view bytes);

}  // namespace tern::agent
