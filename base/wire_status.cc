#include "base/wire_status.h"

#include <string>

#include "base/text.h"

namespace tern {

// The last registered code; a new one must move kMaxWireCode with it.
static_assert(kMaxWireCode == 15);

Status StatusFromWire(uint64_t code, std::string_view who, std::string_view text) {
  if (code == 0) return Status::Ok();
  std::string message(who);
  message += ": ";
  if (code > kMaxWireCode) {
    message += "(unknown error code " + std::to_string(code) + ") ";
    return Status(Code::kInternal, message + Printable(text));
  }
  return Status(static_cast<Code>(code), message + Printable(text));
}

}  // namespace tern
