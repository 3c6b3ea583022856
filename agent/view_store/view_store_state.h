// ViewStore internals shared by view_store.cc (apply, switch, spare) and
// view_store_open.cc (the commit record, Open and crash recovery). Not a
// public header. Sequence and crash analysis: docs/agent/apply.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "agent/view_store/view_store.h"
#include "tern/checkpoint.h"
#include "tern/patch.h"

namespace tern::agent {

// An existing checkpoint directory opened for in-place writes: the tensor
// table from Checkpoint::Open (validated), bytes through read-write mappings.
struct SlotWriter {
  std::unique_ptr<Checkpoint> checkpoint;
  std::vector<std::unique_ptr<MappedFile>> maps;
  MutableServeView view;

  static Result<SlotWriter> Open(Env& env, const std::string& path);
  // msync + fsync of every file of the slot.
  Status Sync();
};

// What state.json records, and what the store believes.
struct ViewStore::State {
  std::string current;  // "a" or "b"; empty: nothing served
  uint64_t version = 0;
  // The board epoch of `version` (docs/agent/board.md §4a): positions
  // (epoch, version) only go up; a supersede moves to a higher epoch with a
  // lower number. Recorded as "epoch" only when not 0 (absent: 0).
  uint32_t epoch = 0;
  ViewDigest digest;
  // The served slot's bytes are durable (fsynced). false: committed from the
  // page cache (the switch no longer waits for the sync); a power loss may
  // have left any mix of old and new pages in it, so Open verifies its
  // digest before serving it (docs/agent/apply.md "Deferred sync").
  bool synced = true;
  // The spare slot holds spare_version (digest spare_digest) completely and
  // durably; false: unknown contents, never used without a full copy. A slot
  // becomes the spare only once it is synced (SyncServed precedes every
  // write to the spare), so a usable spare is always durable.
  bool spare_usable = false;
  uint64_t spare_version = 0;
  uint32_t spare_epoch = 0;  // spare_version's epoch
  ViewDigest spare_digest;
  std::string kept;  // views/<kept>: patch kept_from -> kept_to; empty: none
  uint64_t kept_from = 0, kept_to = 0;
  // current was not re-pointed after the last commit (its rename failed).
  bool link_dirty = false;
  // Not recorded: PrepareSpare brought the spare to `version` in place and
  // kept its mapping, unsynced (state.json calls the spare unusable, so a
  // crash costs a copy, never a wrong spare). Advance applies through the
  // same mapping: its pages are dirty and mapped writable, so the apply
  // takes no write faults, and one sync covers both patches.
  std::shared_ptr<SlotWriter> prepared;
  // Not recorded: the served slot's mapping while !synced, kept from the
  // Advance that wrote it so that the deferred sync needs no reopen.
  std::shared_ptr<SlotWriter> unsynced;
  // Not recorded: a streaming Advance in progress (AdvancePrefix), writing
  // the spare through stream_slot; state.json calls the spare unusable.
  std::shared_ptr<SlotWriter> stream_slot;
  std::shared_ptr<PatchStreamApply> stream;
  uint64_t stream_first_us = 0;  // env clock at the first write

  std::string spare() const { return current == "a" ? "b" : "a"; }
};

namespace view_store_internal {

inline constexpr const char* kStateName = "state.json";

struct Paths {
  std::string dir, views, state;
  explicit Paths(const std::string& d)
      : dir(d), views(d + "/views"), state(d + "/views/" + kStateName) {}
  std::string slot(const std::string& name) const { return views + "/" + name; }
};

std::string KeptName(uint64_t from, uint64_t to);
std::string EncodeState(const ViewStore::State& s);
// Strict: every field present with its type; anything else is kCorrupt.
Result<ViewStore::State> DecodeState(const std::string& text, const std::string& path);
// `recorded` is what state.json is known to hold (empty: unknown), so that
// a write that changes nothing can be skipped.
Status WriteState(Env& env, const Paths& p, const ViewStore::State& s, std::string& recorded);
// current.tmp-<hex> -> views/<slot>, renamed over DIR/current (not synced).
Status Relink(Env& env, const Paths& p, const std::string& slot);
// The deferred sync: makes the served slot durable if it is not (memory
// only; the caller's next WriteState records it).
Status SyncServed(Env& env, const Paths& p, ViewStore::State& s);

}  // namespace view_store_internal
}  // namespace tern::agent
