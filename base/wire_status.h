// The one mapping between a Status and its code on the wire. Every tern wire
// (tcp acks and hello-acks, ucx status headers, verbs acks, xfer status
// messages) carries a Code as its number in the registry of status.h, 0 for
// OK; see docs/format/. The numbers never change meaning, so peers of
// different versions agree on every code both know.
#pragma once

#include <cstdint>
#include <string_view>

#include "tern/status.h"

namespace tern {

inline uint16_t WireCode(const Status& status) { return static_cast<uint16_t>(status.code()); }

// The last registered code: a wire that refuses codes it does not know (ucx
// status headers, verbs acks) bounds them with this. A new code moves it
// (base/wire_status.cc checks the pair).
inline constexpr uint16_t kMaxWireCode = static_cast<uint16_t>(Code::kAuth);

// The Status a peer reported with `code`: OK for 0; the registered Code
// otherwise, or kInternal for a number this side does not know (a newer
// peer), naming it. The message is "<who>: <text>" with text made printable
// (it is the peer's, so untrusted).
Status StatusFromWire(uint64_t code, std::string_view who, std::string_view text);

}  // namespace tern
