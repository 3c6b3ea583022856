// ViewStore: a member's local versions on disk, advanced patch by patch with
// bounded extra space and switched atomically. Spec: docs/agent/apply.md.
//
// Files under `dir` (the agent's --data DIR):
//   current            symlink -> views/a or views/b: the served checkpoint
//   views/a, views/b   two checkpoint directories (the served one, the spare)
//   views/state.json   the commit record (written atomically; authoritative)
//   views/keep-<f>-<t>.patch  the last patch applied (f -> t), kept so the
//                      spare (at f) is brought up to t in place, no copy
// Extra disk space: one model copy (the spare) plus one patch. A full copy is
// made only when the spare is unusable (first Advance after Seed or
// InstallKeyframe, or after a crash or an I/O error touched it).
//
// Advance: bring the spare to version() (apply the kept patch in place, unless
// PrepareSpare already did between versions), apply the new patch in place,
// write the kept patch (not synced: checked when used), commit state.json
// with the new slot marked unsynced, then re-point `current` (a new link
// renamed over the old one; not synced, Open re-derives it). The new slot's
// bytes are synced later, off the critical path (the deferred sync:
// PrepareSpare, or whatever next writes the spare, syncs the served slot
// first). A process crash at any point leaves `current` serving the old or
// the new version, complete and verified; after a power loss Open verifies
// the digest of a slot committed unsynced and serves it, or else the
// previous version (the spare, verified), or else nothing (version 0: the
// agent catches up) — never bytes that are not the version named. Open
// repairs the link from state.json and never serves a spare in an unknown
// state (state.json marks the spare unusable before any write to it). Reader rule: a reader that
// resolved `current` to views/X must be done with it before PrepareSpare or the next Advance runs
// after the switch away from X (either rewrites X in place; the agent calls PrepareSpare a grace
// period after each switch); see docs/agent/apply.md.
//
// AdvancePrefix streams a patch still arriving into a ready spare, record by
// record (PatchStreamApply), and Advance finishes it: same commit and switch,
// and a stream that fails leaves the spare unusable, never served.
//
// Errors: kCorrupt / kUnsupported for damaged or newer-format patches (from
// Inspect/Apply, including changes that do not reach the patch's target
// digest on this base: nothing is switched); kMismatch for a patch whose base is not
// version()/digest(), a target not newer, a seed whose digest is not the
// expected one or a keyframe for another version; kInvalidArgument for a
// version not strictly newer or Advance with nothing served; kCorrupt for a
// damaged state.json (Open names the file); the Env's errors otherwise. On
// any error the served version and its files are unchanged, except: an error
// after the commit point (re-pointing the link) leaves version() at the new
// version, the next call or Open repairs the link; an fsync error inside the
// commit itself may leave the new version committed on disk, served after a
// restart (version() after Open is the truth).
//
// Thread safety: none; one caller at a time (the agent's apply thread). One
// ViewStore per DIR (not enforced by a lock). `pool` is used by one call at a
// time; env, pool and log must outlive the store. Patch bytes are borrowed
// for the call only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "agent/view_store/slot_files.h"
#include "tern/digest.h"
#include "tern/env.h"
#include "tern/log.h"
#include "tern/status.h"

namespace tern {
class ThreadPool;
}

namespace tern::agent {

struct ViewStoreOptions {
  // The old, fully synced switch: Advance fsyncs the new slot before the
  // commit (state.json then never says "unsynced"), so a power loss never
  // costs a re-verification or the version. Off by default: that sync is
  // the largest part of a member's switch (docs/agent/apply.md).
  bool sync_at_switch = false;
};

class ViewStore {
 public:
  // Creates dir/views if missing, removes leftovers (staging copies, stale
  // kept patches), reads state.json and re-points dir/current at the served
  // slot. An empty store serves nothing (version() == 0).
  // A served slot that state.json calls unsynced (a crash after a switch,
  // before its deferred sync) is verified by its digest first and synced, or
  // else the previous version (the spare, verified) is served, or else
  // nothing (docs/agent/apply.md "Deferred sync").
  static Result<std::unique_ptr<ViewStore>> Open(Env& env, std::string dir, ThreadPool& pool,
                                                 LogFn log, ViewStoreOptions options = {});
  ~ViewStore();
  ViewStore(const ViewStore&) = delete;
  ViewStore& operator=(const ViewStore&) = delete;

  // What dir/current serves (0 and a zero digest: nothing yet).
  uint64_t version() const;
  // The board epoch of version() (docs/agent/board.md §4a; 0 before the
  // first supersede), recorded with it in views/state.json.
  uint32_t epoch() const;
  ViewDigest digest() const;
  // dir + "/current".
  std::string current_path() const;

  // Adopts a checkpoint the member already holds (a file or directory; it is
  // copied, not moved) as `version` iff its full digest is `expected`.
  // `version` must be newer than version().
  //
  // Newer means a higher position (epoch, version) (docs/agent/board.md
  // §4a): `epoch` is the new version's board epoch, never below epoch(); a
  // higher epoch may carry a lower number (a supersede: Advance by the
  // backwards patch(withdrawn HEAD -> version)), the same epoch only a
  // higher one. A lower position is refused (kInvalidArgument for Seed and
  // InstallKeyframe, kMismatch for Advance) and changes nothing.
  //
  // Seed, InstallKeyframe and Advance also write the new version's model
  // files into its slot before the switch (WriteSlotFiles: checked against
  // their signed SHA-256, kAuth otherwise, and nothing is switched); the
  // slot then holds exactly those besides its tensors. None (a version of
  // a format-1 manifest): the slot's other files are left as they are.
  Status Seed(const std::string& checkpoint_path, uint64_t version, const ViewDigest& expected,
              const std::vector<SlotFile>& files = {}, uint32_t epoch = 0);
  // A keyframe: a patch from the all-zero view of its own tensor table to
  // `version` (its target version must be `version`, newer than version()).
  // The spare is created zero-filled (sparse) from the patch's layout.
  Status InstallKeyframe(std::span<const uint8_t> keyframe, uint64_t version,
                         const std::vector<SlotFile>& files = {}, uint32_t epoch = 0);
  // Advances to the patch's target. Its base must be version()/digest(); a
  // squash (a -> b with a == version()) is a patch like any other. Finishes
  // a stream of the same patch (AdvancePrefix); a stream that fails here is
  // dropped and the whole patch applied to a copy instead.
  Status Advance(std::span<const uint8_t> patch, const std::vector<SlotFile>& files = {},
                 uint32_t epoch = 0);

  // Streaming Advance (docs/agent/apply.md "Streaming apply"): `prefix` is
  // the beginning of a patch still arriving, verified by the caller (every
  // byte authentic), growing from call to call (the same bytes at the same
  // offsets; the buffer may move). Each segment record complete in it is
  // applied to the spare at once; Advance(whole patch) then applies the rest,
  // checks the target digest and switches as usual (the data sync deferred). Streams only into
  // a ready spare (spare_ready(): PrepareSpare ran, so the reader rule is
  // kept); otherwise, and for a patch whose base is not version()/digest(),
  // it does nothing and Advance takes the whole-patch path. state.json
  // calls the spare unusable before the first write. Errors (a damaged
  // record, a wrong layout): the stream is dropped, the spare is unusable
  // (the next Advance copies), nothing is served or switched.
  Status AdvancePrefix(std::span<const uint8_t> prefix);
  // Drops a stream (the spare is left unusable). Seed, InstallKeyframe and an
  // Advance of another patch drop it too.
  void AbortAdvance();
  // A stream has begun (AdvancePrefix wrote or will write the spare).
  bool advancing() const;

  // Makes the served slot durable if the switch left it unsynced (the
  // deferred sync, recorded in state.json), then brings the spare to
  // version() (the kept patch applied in place, or a full copy of the served
  // slot when the spare is unusable), so that the next Advance only applies its own patch. Meant
  // to run between versions, off the critical path, once readers are done
  // with the slot the last switch left (it rewrites that slot: the reader
  // rule in docs/agent/apply.md). Nothing to do when spare_ready().
  // Errors: the Env's; the served version is never touched, and a failure
  // leaves the spare unusable (the next Advance copies).
  Status PrepareSpare();
  // The spare holds version() completely and durably (PrepareSpare done).
  bool spare_ready() const;
  // The served slot's bytes are durable (false between a switch and its
  // deferred sync).
  bool served_synced() const;

  struct State;

 private:
  ViewStore(Env& env, std::string dir, ThreadPool& pool, LogFn log, ViewStoreOptions options);
  Env& env_;
  const std::string dir_;
  ThreadPool& pool_;
  LogFn log_;
  const ViewStoreOptions options_;
  std::unique_ptr<State> state_;
  // The text state.json is known to hold (the last successful write; empty
  // after a failed one and at Open): a write of the same record is skipped.
  std::string recorded_;
};

}  // namespace tern::agent
