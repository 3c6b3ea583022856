// ObjectRef: names one object of a board (docs/agent/board.md §1), shared by
// the board, the relay and the control plane. Objects are patch-format byte
// strings: patch(from -> to), keyframe(to) (from == to; a patch from the
// zero view), squash(from -> to).
//
// Thread safety: values.
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "tern/status.h"
#include "tern/version_manifest.h"

namespace tern::agent {

struct ObjectRef {
  ObjectKind kind = ObjectKind::kPatch;
  uint64_t from = 0, to = 0;
  auto operator<=>(const ObjectRef&) const = default;
};

// "patch", "keyframe", "squash" ("unknown" for other values).
const char* ObjectKindName(ObjectKind kind);
// "patch-1-2", "keyframe-5-5", "squash-1-9": the file name under DIR/objects/.
std::string ObjectName(const ObjectRef& ref);
// "files/<SHA-256 in hex>": where a version's model file (a ManifestFile)
// lies under the root's object service and a member's file cache, named by
// its content so that versions sharing a file share one copy.
std::string ModelFileObjectName(const Sha256Hash& sha256);
// How the root cuts an object into chunks unless told otherwise (the
// manifest's chunk_bytes; PublishOptions::chunk_bytes overrides): 4 MiB;
// objects under 16 MiB into 8 to 16 chunks of a power of two from 64 KiB to
// 1 MiB (64 KiB below 512 KiB: fewer chunks). A relay forwards after one
// verified chunk, and a connection spreads an object's chunks over its warm
// streams by their pacing (transport/tcp/stream_choice.h), so a small patch
// is neither stored and forwarded whole at each hop nor carried by one
// stream at that stream's share of the link (docs/agent/board.md §1). The
// planner's and the simulator's estimates use this too.
uint32_t DefaultChunkBytes(uint64_t object_bytes);

// kCorrupt unless the kind is known and from/to fit it (keyframe: from ==
// to >= 1; patch and squash: from < to). For references read off the wire.
Status ValidateObjectRef(const ObjectRef& ref);

}  // namespace tern::agent
