// A ring of pinned host slots through which received bytes reach device
// memory (the fallback when the NIC cannot write into GPU memory): the
// receiver fills one slot while the copies of the slots before it run, so
// the upload overlaps the transfer. Docs: docs/gpu.md, "Receive".
//
// The ring's logic is plain host code behind a CopyEngine (what it needs of
// CUDA: start an asynchronous copy of a slot, ask whether it has finished,
// wait for it), so gpu/host/staging_ring_test.cc checks it on the CPU with a fake
// engine; gpu/kernels/staging_copy.cu supplies the CUDA engine (cudaMemcpyAsync and
// one event per slot on one stream).
//
// Contract:
// * memory is bounded: `slots` buffers of `slot_bytes`, fixed at creation;
// * slot states go kFree -> kFilling (Acquire) -> kInFlight (Submit) ->
//   kFree (its copy reported done), slots are used in ring order;
// * back-pressure: Acquire with no free slot waits for the oldest copy (the
//   only blocking call besides Drain), so a fast sender is held to the
//   copy engine's pace and never allocates;
// * order: the stream's bytes land at increasing device offsets in the
//   order submitted, and bytes_done() only ever covers a prefix of the
//   stream whose copies have all finished, even if an engine reports slots
//   done out of order;
// * errors are sticky: after an engine error every call returns it.
// Not thread safe: one receiver drives a ring.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tern/status.h"

namespace tern::gpu {

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Starts copying n bytes from src (slot `slot`'s buffer) to the
  // destination at dst_offset; returns before the copy finishes.
  [[nodiscard]] virtual Status Start(int slot, const uint8_t* src, uint64_t n, uint64_t dst_offset) = 0;
  // Whether slot's last started copy has finished (no waiting).
  [[nodiscard]] virtual Result<bool> Done(int slot) = 0;
  // Waits until slot's last started copy has finished.
  [[nodiscard]] virtual Status Wait(int slot) = 0;
};

enum class SlotState : uint8_t { kFree, kFilling, kInFlight };

class StagingRing {
 public:
  // slot_buffers: `slots` host buffers of slot_bytes each (pinned for the
  // CUDA engine), owned by the caller; dst_bytes: the destination's size.
  StagingRing(std::vector<uint8_t*> slot_buffers, uint64_t slot_bytes, uint64_t dst_bytes, CopyEngine* engine);

  // The next slot to receive into (ring order); waits for its previous copy
  // when it is still in flight. One slot fills at a time.
  [[nodiscard]] Result<std::span<uint8_t>> Acquire();
  // Hands the first n bytes of the acquired slot to the engine, to land at
  // the stream's current offset. n <= slot_bytes, and the stream must fit
  // the destination; n == 0 returns the slot unused.
  [[nodiscard]] Status Submit(uint64_t n);
  // Acquire + copy + Submit for bytes the receiver already holds elsewhere.
  [[nodiscard]] Status Push(std::span<const uint8_t> data);
  // Retires every finished copy in order, without waiting.
  [[nodiscard]] Status Poll();
  // Waits for every copy in flight; then bytes_done() == bytes_submitted().
  [[nodiscard]] Status Drain();

  uint64_t bytes_submitted() const { return submitted_; }
  // Bytes of the stream, from its start, whose copies have finished.
  uint64_t bytes_done() const { return done_; }
  int slots() const { return static_cast<int>(slots_.size()); }
  SlotState state(int slot) const { return slots_[slot].state; }
  int in_flight() const;

 private:
  struct Slot {
    uint8_t* buffer = nullptr;
    SlotState state = SlotState::kFree;
    uint64_t bytes = 0;  // submitted bytes (kInFlight)
  };
  // Retires the oldest in-flight slot if its copy is done (wait: until it is).
  [[nodiscard]] Result<bool> RetireOldest(bool wait);
  Status Fail(Status s);

  std::vector<Slot> slots_;
  uint64_t slot_bytes_, dst_bytes_;
  CopyEngine* engine_;
  int next_ = 0;        // the slot Acquire hands out next
  int oldest_ = 0;      // the oldest in-flight slot (when any)
  int flying_ = 0;      // slots in flight
  int filling_ = -1;    // the acquired slot, -1: none
  uint64_t submitted_ = 0, done_ = 0;
  Status error_ = Status::Ok();
};

}  // namespace tern::gpu
