// ObjectRef names (agent/object_ref.h).
#include "agent/object_ref.h"

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

}  // namespace tern::agent
