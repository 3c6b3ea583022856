// The agent's data-plane messages (types 0x40-0x7F), as pure encoders and
// strict decoders. Byte layout: docs/format/agent.md §7 ("Data messages").
// RelayNode parses peer bytes only through these; the fuzzer
// (agent/relay/fuzz_data_wire.cc) drives them directly.
//
// Every message starts with `u8 type, u8 reserved(0), u16 reserved(0)`.
// Decoders take untrusted bytes: they check the exact length, bound every
// count and length before use, require reserved fields to be zero and
// return kCorrupt for anything malformed (kProtocol for a type that is not
// the one asked for). Encoders assert on values the decoder would refuse
// (the caller's bug), so encode/decode is a bijection on valid messages.
//
// Thread safety: plain functions over values.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agent/manifest/object_ref.h"
#include "tern/status.h"
#include "tern/version_manifest.h"

namespace tern::agent {


enum class DataType : uint8_t {
  kSubscribe = 0x40,  // child -> parent, once, first on a data connection
  kOffer = 0x41,      // parent -> child: a signed manifest and which object
  kHashes = 0x42,     // parent -> child: part of an object's chunk hash list
  kWant = 0x43,       // child -> parent: receive windows open for these chunks
  kFetch = 0x44,      // child -> parent: offer me this (older) object
  kGone = 0x45,       // parent -> child: I do not have / no longer serve it
  kPush = 0x46,       // parent -> child: these chunks come into your push window, unasked
  kPushDone = 0x47,   // child -> parent: every pushed chunk copied out; the window is free
};

// Bounds (the spec's MUSTs).
inline constexpr uint32_t kMaxMemberIdBytes = 256;
inline constexpr uint16_t kMaxStripes = 16;
inline constexpr uint64_t kMaxSignedManifestBytes =
    kMaxManifestBytes + kManifestTrailerBytes;
// 1 MiB of hashes per HASHES message (well under kMaxMessageBytes).
inline constexpr uint32_t kMaxHashesPerMessage = uint32_t{1} << 15;
inline constexpr uint32_t kMaxWantChunks = 4096;
inline constexpr uint32_t kMaxReasonBytes = 1024;
inline constexpr uint32_t kMaxTokenBytes = 1024;
// Window ids of one object on one connection: window_base + chunk index, so
// a base must leave room for every chunk.
inline constexpr uint64_t kMaxWindowBase = UINT64_MAX - kMaxManifestChunks;
// A child's standing push window (SUBSCRIBE's push_window_bytes) has transfer
// id 0, which no per-chunk window uses (bases start at 1).
inline constexpr uint64_t kPushWindowId = 0;
inline constexpr uint32_t kMaxPushWindowBytes = uint32_t{64} << 20;

// The message's type byte, or 0 for an empty message.
uint8_t DataTypeOf(std::string_view message);

struct Subscribe {
  std::string member_id;  // 1 .. kMaxMemberIdBytes
  uint16_t stripe = 0;    // < stripes
  uint16_t stripes = 1;   // 1 .. kMaxStripes
  // The deployment's join token (0 .. kMaxTokenBytes): a parent configured
  // with one serves no child that does not present it.
  std::string token;
  // The newest version the child serves (0: none). The parent offers it only
  // objects whose target is newer: what it serves it needs no more of.
  uint64_t served_version = 0;
  // The bytes of the receive window (transfer id kPushWindowId) the child
  // keeps posted for pushed chunks, 0 .. kMaxPushWindowBytes; 0: no push.
  uint32_t push_window_bytes = 0;
};
struct Offer {
  uint32_t object_index = 0;    // into the manifest's objects (checked after Verify)
  std::string signed_manifest;  // 1 .. kMaxSignedManifestBytes, verified by the caller
};
struct Hashes {
  ObjectRef object;
  uint32_t first = 0;       // index of the first hash
  std::vector<Sha256Hash> hashes;  // 1 .. kMaxHashesPerMessage; first + size <= kMaxManifestChunks
};
struct Want {
  ObjectRef object;
  uint64_t window_base = 0;       // chunk i lands in window window_base + i; <= kMaxWindowBase
  std::vector<uint32_t> chunks;   // 1 .. kMaxWantChunks, strictly increasing, < kMaxManifestChunks
};
// The first `count` chunks of the child's stripe of `object` (indices
// stripe, stripe + stripes, ...) travel unasked into its push window, packed
// from offset 0 in that order. Sent before that object's OFFER.
struct Push {
  ObjectRef object;
  uint32_t count = 0;  // 1 .. kMaxWantChunks
};
struct Gone {
  ObjectRef object;
  Code code = Code::kNotFound;
  std::string reason;  // <= kMaxReasonBytes (Encode cuts longer ones)
};

std::string EncodeSubscribe(const Subscribe& m);
Result<Subscribe> DecodeSubscribe(std::string_view in);
std::string EncodeOffer(const Offer& m);
Result<Offer> DecodeOffer(std::string_view in);
std::string EncodeHashes(const Hashes& m);
Result<Hashes> DecodeHashes(std::string_view in);
std::string EncodeWant(const Want& m);
Result<Want> DecodeWant(std::string_view in);
std::string EncodeFetch(const ObjectRef& m);
Result<ObjectRef> DecodeFetch(std::string_view in);
std::string EncodePush(const Push& m);
Result<Push> DecodePush(std::string_view in);
std::string EncodePushDone(const ObjectRef& m);
Result<ObjectRef> DecodePushDone(std::string_view in);
std::string EncodeGone(const Gone& m);
Result<Gone> DecodeGone(std::string_view in);

}  // namespace tern::agent
