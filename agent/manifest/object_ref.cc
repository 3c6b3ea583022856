// ObjectRef names (agent/manifest/object_ref.h).
#include "agent/manifest/object_ref.h"

#include "base/text.h"

namespace tern::agent {

const char* ObjectKindName(ObjectKind kind) {
  switch (kind) {
    case ObjectKind::kPatch: return "patch";
    case ObjectKind::kKeyframe: return "keyframe";
    case ObjectKind::kSquash: return "squash";
  }
  return "unknown";
}

std::string ObjectName(const ObjectRef& ref) {
  return std::string(ObjectKindName(ref.kind)) + "-" + std::to_string(ref.from) + "-" +
         std::to_string(ref.to);
}

std::string ModelFileObjectName(const Sha256Hash& sha256) { return "files/" + Hex(sha256); }

uint32_t DefaultChunkBytes(uint64_t object_bytes) {
  constexpr uint64_t kSmallObjectBytes = uint64_t{16} << 20;
  constexpr uint32_t kMinChunks = 8;
  if (object_bytes >= kSmallObjectBytes) return uint32_t{4} << 20;
  uint32_t chunk = uint32_t{64} << 10;
  while (chunk < (uint32_t{1} << 20) && uint64_t{chunk} * 2 * kMinChunks <= object_bytes) chunk *= 2;
  return chunk;
}

Status ValidateObjectRef(const ObjectRef& ref) {
  switch (ref.kind) {
    case ObjectKind::kKeyframe:
      TERN_REQUIRE(ref.from == ref.to && ref.to >= 1, kCorrupt, "keyframe reference ", ref.from,
                   "->", ref.to, ": from must equal to (>= 1)");
      return Status::Ok();
    case ObjectKind::kPatch:
    case ObjectKind::kSquash:
      // Numbers are ordered within a board epoch; a supersede's patch and a
      // squash from a withdrawn version run backwards into the next epoch
      // (docs/agent/board.md §4a), which only the signed manifest can say.
      TERN_REQUIRE(ref.from != ref.to, kCorrupt, "object reference ", ref.from, "->", ref.to,
                   ": from and to must differ");
      return Status::Ok();
  }
  return TERN_ERROR(kCorrupt, "unknown object kind ", static_cast<int>(ref.kind));
}

}  // namespace tern::agent
