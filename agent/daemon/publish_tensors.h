// The serve view of a publish from memory (Agent::PublishTensors): the
// caller's tensors checked and borrowed as a ServeView, in digest order.
//
// Checks, each refused with one message naming the tensor (prefixed with
// `who`, the caller's name):
//  * every tensor alone (kInvalidArgument): a non-empty name of at most
//    kMaxPublishTensorName bytes, a known dtype, at most
//    kMaxPublishTensorRank dimensions, a shape whose size fits
//    (CheckedElements), `bytes` equal to that size, a non-null pointer
//    unless the tensor is empty; no name twice; at most kMaxPublishTensors
//    tensors (the bounds: tern/agent.h).
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

Result<std::unique_ptr<BorrowedView>> ViewOfTensors(const std::vector<PublishTensor>& tensors,
                                                    const ServeView* served,
                                                    const char* who = "publish_tensors");

}  // namespace tern::agent
