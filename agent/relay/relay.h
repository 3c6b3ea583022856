// RelayNode: the agent's data plane. Objects (patches, keyframes, squashes;
// byte strings named by ObjectRef) move parent -> child over long-lived data
// connections, cut-through: a relay forwards chunk i to its children as soon
// as chunk i is verified, before the object is complete. Spec:
// docs/agent/relay.md; messages: docs/format/agent.md §7 (agent/relay/data_wire.h).
//
// A node holds objects in files DIR/objects/<kind>-<from>-<to> (".part" while
// receiving), mapped and registered with the transport; payloads land once in
// that mapping and are forwarded from it. Trust: bytes count only once they
// chain up to a manifest the verifier accepts and on_manifest approves:
//   signature -> manifest -> chunk_hashes_root -> hash list -> SHA-256 per chunk.
// A chunk lands in a window opened for that chunk alone and the window is
// cancelled before the chunk is hashed, or (pushed: a new object's first
// chunks, sent with the OFFER without waiting for WANT) lands in the link's
// standing push window and is copied into the object's buffer before it is
// hashed; either way a parent cannot rewrite verified bytes. A chunk is
// forwarded, counted or reported only after VerifyChunk.
//
// Errors: bad bytes from a peer (malformed message, forged or foreign
// manifest, a hash list or chunk that fails its hash, a credit beyond the
// bounds) never crash or hang the node: the message is refused with a logged
// reason and, where the peer broke the protocol, its connection is closed.
// A corrupt chunk is asked for again; a parent whose chunks fail SHA-256
// bad_chunks_max times is dropped and reported (on_parent_failed, kAuth,
// ParentLoss::kBadContent) so the lead re-plans. A parent connection that
// fails is reported too (its status, kLink); the node does not re-dial by
// itself: SetParent again.
//
// Bounds: objects held <= max_objects, children <= max_children, chunk
// windows per parent link and object <= window_chunks and <= window_bytes
// of them (at least one), credits a child may hold at its
// parent <= kMaxWantChunks (pushed chunks included), queued peer messages <=
// inbox_messages_max (a peer past it is disconnected), one push window of
// push_window_bytes per parent link. A slow child holds only its own credits: sends
// to each child are independent and nothing is queued per child beyond the
// indices it asked for.
//
// Threads: transport callbacks only queue events; one worker thread owned by
// the node handles every event and calls the callbacks below (never with a
// lock of the node held, so they may call Progress/Stats; they must not call
// the destructor). Every public method may be called from any thread.
//
// Ownership: the Transport, Env and verifier must outlive the node. The
// destructor stops the listener, closes every connection (after which the
// backend no longer touches the mappings), then unmaps; events the backend
// still delivers after that are dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "agent/relay/data_wire.h"
#include "tern/env.h"
#include "tern/log.h"
#include "tern/status.h"
#include "tern/transport.h"
#include "tern/version_manifest.h"

namespace tern::agent {

// A hold of a relay node's lock this long is counted (RelayNode::lock_watch).
inline constexpr uint64_t kSlowRelayLockHoldUs = 100'000;

struct RelayOptions {
  std::string member_id = "member";  // sent in SUBSCRIBE (1 .. kMaxMemberIdBytes)
  // Sent in SUBSCRIBE, and required of every child when non-empty (compared
  // in constant time): without it a child gets nothing (its link is closed).
  std::string join_token;
  uint32_t window_chunks = 16;       // chunk windows open per parent link (1 .. kMaxWantChunks)
  // ... and at most this many bytes of them (never fewer than one window):
  // what a relay holds resident while an object passes is its windows
  // plus its children's, so they are also counted in bytes, not only in
  // chunks of whatever size the publisher chose. 64 MiB keeps the
  // throughput of 16 windows of 4 MiB chunks (a link carries at most this
  // per round trip); a smaller bound trades it for memory
  // (tern-agent --window-bytes). 0: chunks only.
  uint64_t window_bytes = uint64_t{64} << 20;
  uint32_t bad_chunks_max = 3;       // SHA-256 failures from one parent before it is dropped
  uint32_t send_retries_max = 3;     // resends of a chunk the transport found corrupt (XXH3)
  uint32_t max_objects = 64;
  uint32_t max_children = 64;
  uint32_t inbox_messages_max = 4096;
  // Bytes of the standing receive window this node keeps posted on each
  // parent link (announced in SUBSCRIBE, 0 .. kMaxPushWindowBytes; 0: none).
  // A parent pushes a new object's first chunks of the stripe into it with
  // the OFFER, without waiting for WANT (docs/agent/relay.md "Push").
  uint32_t push_window_bytes = uint32_t{2} << 20;
};

// Why a parent link ended, for on_parent_failed. Only kBadContent is
// evidence against the parent. kLink keeps its kAuth status for a TLS
// certificate refused at the dial (by either side: a configuration fault, or
// an impostor at that address) and for a manifest signed by a key this node
// does not trust (SignerStanding, tern/version_manifest.h: a key set it has
// not learned yet, a key revoked or expired by its clock): the parent relays
// what the root signed, so that is this node's key set, not the parent.
enum class ParentLoss : uint8_t {
  kLink,        // the dial failed or the connection ended, or the parent broke the protocol
  kBadContent,  // a manifest whose signature a trusted key id does not vouch for, or a
                // hash list or chunks failing their signed hashes
};

struct RelayCallbacks {
  // A verified manifest from a parent, before any byte of it is accepted:
  // return false to refuse (the lead's replay check). Null: accept.
  std::function<bool(const std::string& signed_manifest, const VersionManifest&)> on_manifest;
  // Chunks 0 .. k-1 are verified and k grew: their bytes, `prefix_bytes`
  // from the start of `part_path` (the ".part" file, mapped by the node; a
  // verified chunk is never written again), are final. Not called for the
  // chunk that completes the object (on_object_complete is). Null: nothing.
  std::function<void(const ObjectRef&, const std::string& part_path, uint64_t prefix_bytes)>
      on_prefix_verified;
  // Every chunk verified; the file is renamed to its final path (not synced:
  // nothing reads a received object after a restart).
  std::function<void(const ObjectRef&, const std::string& path)> on_object_complete;
  // The parent link of `stripe` ended: closed, failed, or dropped (`loss`
  // says whether for content that failed verification). Not called for a
  // link SetParent replaced.
  std::function<void(uint32_t stripe, const Status&, ParentLoss loss)> on_parent_failed;
};

struct LinkStats {
  std::string peer;    // address (a child's: its member id)
  bool parent = false; // this node's parent link, else a child's
  uint32_t stripe = 0, stripes = 1;
  uint64_t bytes_in = 0, bytes_out = 0;
  // Verified chunks received / chunks sent that the child acknowledged. A
  // send the child cancelled because another parent's copy came first
  // (striping: kNotFound) is not counted, so a striped parent's chunks_out
  // can be below the chunks its child assembled.
  uint64_t chunks_in = 0, chunks_out = 0;
  // Parent links: chunk bytes the transport has taken off this link's
  // connection so far, whole chunks or not (Connection::chunk_bytes_received;
  // 0 where the backend does not count them): a slow link's progress
  // between two verified chunks. Not in Totals.
  uint64_t wire_bytes_in = 0;
  uint64_t retries = 0;     // chunks sent again (transport kCorrupt)
  uint64_t bad_chunks = 0;  // chunks received that failed SHA-256
  // Parent links: bytes of the last completed object received here over the
  // time from its OFFER (for a pushed object: from its PUSH's arrival,
  // however late the worker got to the OFFER behind it) to its completion
  // (env clock; 0: none yet). With cut-through this is the rate the tree
  // delivered, not the link's capacity.
  double last_rate_in_bytes_per_s = 0;
};

struct LinkTotals {
  uint64_t bytes_in = 0, bytes_out = 0;
  uint64_t retries = 0, bad_chunks = 0;
  void Add(const LinkStats& l) {
    bytes_in += l.bytes_in;
    bytes_out += l.bytes_out;
    retries += l.retries;
    bad_chunks += l.bad_chunks;
  }
};

struct ObjectProgress {
  uint32_t chunk_count = 0;
  uint32_t verified_chunks = 0;
  bool hashes_verified = false;
  bool complete = false;
};

class RelayNode {
 public:
  RelayNode(Transport& transport, Env& env, std::string objects_dir,
            const ManifestVerifier& verifier, BoardId board, LogFn log, RelayOptions options,
            RelayCallbacks callbacks);
  ~RelayNode();
  RelayNode(const RelayNode&) = delete;
  RelayNode& operator=(const RelayNode&) = delete;

  // A second (third...) transport links may run on, e.g. RDMA for children
  // and parents inside one cluster next to TCP for the rest. Every object's
  // mapping is registered once with each transport, so a chunk is sent to
  // a child from the same bytes whichever transport carries it (no copy
  // per transport). Call before anything else (kInvalidArgument once an
  // object or link exists); the transport must outlive the node.
  Status AddTransport(Transport& transport);

  // Accepts children on `address` (Listen of the transport); address() is
  // the bound one. At most one listener.
  Status Listen(const std::string& address);
  std::string address() const;
  // For a caller that owns the listener: hand each data connection here.
  // `via`: the transport the listener belongs to (null: the first); a
  // connection accepted on a transport not added is closed.
  AcceptHandler ChildAcceptor(Transport* via = nullptr);

  // Dials the parent of `stripe` (0 .. stripes-1, stripes <= kMaxStripes),
  // replacing the previous one; chunks of this stripe still missing resume
  // from the new parent. Errors arrive through on_parent_failed.
  // `via`: the transport to dial with (null: the first; one not added fails
  // the stripe with kInvalidArgument through on_parent_failed).
  void SetParent(uint32_t stripe, uint32_t stripes, std::string address, Transport* via = nullptr);
  // The newest version this node serves, announced in the SUBSCRIBE of each
  // later dial: a parent then offers only objects of newer versions (no
  // re-offers of what the lead would refuse after a re-plan). 0: none.
  void SetServedVersion(uint64_t version);

  // Asks the parent of `stripe` to offer `ref` again (catch-up of an older
  // object, or one on_manifest refused before); the answer is an OFFER or,
  // when the parent does not hold it, a logged GONE.
  void Fetch(uint32_t stripe, const ObjectRef& ref);

  // Stops holding `ref` (the lead's retention): no more offers or chunks of
  // it; windows still open for it are closed and its ".part" (if it was
  // incomplete) is removed. A complete file is left for the lead. Sends
  // already in flight finish first; until then an OFFER of `ref` is ignored.
  void Forget(const ObjectRef& ref);

  // Root side: serves a complete object already on disk at `path`, listed
  // in `signed_manifest`. Hashes every chunk and checks the signed root
  // before serving (kAuth on a mismatch), kNotFound when the manifest does
  // not list `ref`, kMismatch for a wrong size or board.
  Status Offer(std::string signed_manifest, const ObjectRef& ref, const std::string& path);

  // kNotFound for an object this node does not hold.
  Result<ObjectProgress> Progress(const ObjectRef& ref) const;
  // The links open now.
  std::vector<LinkStats> Stats() const;
  // Everything this node ever moved, closed links included: what a
  // heartbeat reports, so that the root's *_total counters never go down
  // when a link closes (a child dropping a lying parent, a re-plan).
  LinkTotals Totals() const;
  // Holds of this node's lock of kSlowRelayLockHoldUs or more (base/mutex.h):
  // its readers above wait for them, and so does a caller holding its own
  // lock meanwhile (the agent's tick).
  const LockWatch& lock_watch() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::agent
