// The serve view of a publish from memory (Agent::PublishTensors): the
// caller's tensors checked and borrowed as a ServeView, in digest order.
//
// Checks, each refused with one message naming the tensor:
//  * every tensor alone (kInvalidArgument): a non-empty name of at most 4096
//    bytes, a known dtype, at most 8 dimensions, a shape whose size fits
//    (CheckedElements), `bytes` equal to that size, a non-null pointer
//    unless the tensor is empty; no name twice; at most 1,000,000 tensors.
//  * against `served`, the layout the root serves (kMismatch): the same
//    names (one it lacks is "not in the served layout", one it has that is
//    absent is "missing"), and for each the same dtype and shape.
// `served` null: no layout yet (the board's first version, or a root that
// took the board over); any set of valid tensors is a layout.
//
// The result borrows the tensors' bytes (not copied) and owns the
// descriptions; it must not outlive the caller's buffers.
//
// Thread safety: a pure function.
#pragma once

#include <memory>
#include <vector>

#include "tern/agent.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern::agent {

struct BorrowedView {
  std::vector<TensorDesc> descs;  // view.tensors point into it: never resized
  ServeView view;
};

inline constexpr size_t kMaxPublishTensors = 1'000'000;
inline constexpr size_t kMaxPublishTensorName = 4096;
inline constexpr size_t kMaxPublishTensorRank = 8;

Result<std::unique_ptr<BorrowedView>> ViewOfTensors(const std::vector<PublishTensor>& tensors,
                                                    const ServeView* served);

}  // namespace tern::agent
