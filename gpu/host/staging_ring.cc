#include "gpu/host/staging_ring.h"

#include <cstring>
#include <utility>

namespace tern::gpu {

StagingRing::StagingRing(std::vector<uint8_t*> slot_buffers, uint64_t slot_bytes, uint64_t dst_bytes,
                         CopyEngine* engine)
    : slot_bytes_(slot_bytes), dst_bytes_(dst_bytes), engine_(engine) {
  slots_.resize(slot_buffers.size());
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].buffer = slot_buffers[i];
  if (slots_.empty() || slot_bytes_ == 0 || engine_ == nullptr)
    error_ = TERN_ERROR(kInvalidArgument, "staging ring: needs at least one slot of at least one byte and an engine");
}

int StagingRing::in_flight() const { return flying_; }

Status StagingRing::Fail(Status s) {
  if (error_.ok()) error_ = s;
  return s;
}

Result<bool> StagingRing::RetireOldest(bool wait) {
  if (flying_ == 0) return false;
  Slot& s = slots_[oldest_];
  if (wait) {
    const Status st = engine_->Wait(oldest_);
    if (!st.ok()) return Fail(st);
  } else {
    Result<bool> done = engine_->Done(oldest_);
    if (!done.ok()) return Fail(done.status());
    if (!*done) return false;
  }
  // In ring order: the bytes of every older slot are done already, so the
  // done prefix grows by exactly this slot's bytes.
  done_ += s.bytes;
  s.state = SlotState::kFree;
  s.bytes = 0;
  oldest_ = (oldest_ + 1) % slots();
  --flying_;
  return true;
}

Result<std::span<uint8_t>> StagingRing::Acquire() {
  TERN_RETURN_IF_ERROR(error_);
  TERN_REQUIRE(filling_ < 0, kInvalidArgument, "staging ring: slot ", filling_, " acquired and not submitted");
  // Back-pressure: the next slot in ring order is the oldest in flight when
  // every slot is; wait for its copy.
  while (slots_[next_].state != SlotState::kFree) {
    TERN_ASSIGN_OR_RETURN(const bool retired, RetireOldest(/*wait=*/true));
    if (!retired) return Fail(TERN_ERROR(kInternal, "staging ring: slot ", next_, " busy with nothing in flight"));
  }
  filling_ = next_;
  slots_[filling_].state = SlotState::kFilling;
  return std::span<uint8_t>(slots_[filling_].buffer, slot_bytes_);
}

Status StagingRing::Submit(uint64_t n) {
  TERN_RETURN_IF_ERROR(error_);
  TERN_REQUIRE(filling_ >= 0, kInvalidArgument, "staging ring: Submit without Acquire");
  TERN_REQUIRE(n <= slot_bytes_, kInvalidArgument, "staging ring: ", n, " bytes submitted to a slot of ",
               slot_bytes_);
  TERN_REQUIRE(n <= dst_bytes_ - submitted_, kResourceExhausted, "staging ring: ", submitted_ + n,
               " bytes would overflow the destination of ", dst_bytes_);
  Slot& s = slots_[filling_];
  const int slot = filling_;
  filling_ = -1;
  if (n == 0) {  // nothing received: the slot goes back, next_ stays
    s.state = SlotState::kFree;
    return Status::Ok();
  }
  const Status st = engine_->Start(slot, s.buffer, n, submitted_);
  if (!st.ok()) {
    s.state = SlotState::kFree;
    return Fail(st);
  }
  s.state = SlotState::kInFlight;
  s.bytes = n;
  if (flying_ == 0) oldest_ = slot;
  ++flying_;
  submitted_ += n;
  next_ = (slot + 1) % slots();
  return Status::Ok();
}

Status StagingRing::Push(std::span<const uint8_t> data) {
  while (!data.empty()) {
    TERN_ASSIGN_OR_RETURN(std::span<uint8_t> slot, Acquire());
    const uint64_t n = std::min<uint64_t>(slot.size(), data.size());
    std::memcpy(slot.data(), data.data(), n);
    TERN_RETURN_IF_ERROR(Submit(n));
    data = data.subspan(n);
  }
  return Poll();
}

Status StagingRing::Poll() {
  TERN_RETURN_IF_ERROR(error_);
  for (;;) {
    TERN_ASSIGN_OR_RETURN(const bool retired, RetireOldest(/*wait=*/false));
    if (!retired) return Status::Ok();
  }
}

Status StagingRing::Drain() {
  TERN_RETURN_IF_ERROR(error_);
  while (flying_ > 0) {
    TERN_ASSIGN_OR_RETURN(const bool retired, RetireOldest(/*wait=*/true));
    (void)retired;
  }
  return Status::Ok();
}

}  // namespace tern::gpu
