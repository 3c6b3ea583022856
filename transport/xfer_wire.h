// The xfer application protocol behind `tern xfer` (docs/format/wire.md §5,
// version 1) and the client's resume-state file, as pure encoders and
// decoders: the file server and FetchFile parse peer bytes only through
// these, and the fuzzers drive them directly. Every length and count is
// bounded before it is used.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tern/status.h"

namespace tern::xfer {

inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kMaxNameBytes = 4096;
inline constexpr uint32_t kMaxReasonBytes = 4096;
inline constexpr uint64_t kMinChunkBytes = 4096;
// A transfer has at most this many chunks, so its WANT bitmap (<= 8 MiB)
// always fits one message and the client's chunk map stays small.
inline constexpr uint64_t kMaxChunks = uint64_t{1} << 26;

// Message types: the first byte of every xfer message.
inline constexpr char kGet = 'G';
inline constexpr char kInfo = 'I';
inline constexpr char kError = 'E';
inline constexpr char kWant = 'W';
inline constexpr char kDone = 'D';

// 0 for an empty message.
inline char TypeOf(std::string_view message) { return message.empty() ? '\0' : message[0]; }

struct GetRequest {
  uint64_t chunk_bytes = 0;  // kMinChunkBytes .. kMaxChunkBytes
  std::string name;          // 1 .. kMaxNameBytes, no NUL
};
struct Info {
  uint64_t size_bytes = 0;
  uint64_t xxh3 = 0;
  uint64_t transfer_id = 0;
};
struct Want {
  uint64_t transfer_id = 0;
  std::string bitmap;  // ChunkMap::bits() of the chunks the client has
};

std::string EncodeGet(const GetRequest& get);
// kProtocol for another xfer version; kOutOfRange for a chunk size outside
// its bounds; kInvalidArgument for an empty name or one with NUL; kCorrupt
// for anything malformed.
Result<GetRequest> DecodeGet(std::string_view message);

std::string EncodeInfo(const Info& info);
Result<Info> DecodeInfo(std::string_view message);

std::string EncodeWant(uint64_t transfer_id, std::string_view bitmap);
// The bitmap may be at most max_bitmap_bytes long (the caller checks it fits
// its chunk map exactly).
Result<Want> DecodeWant(std::string_view message, uint64_t max_bitmap_bytes);

// ERROR and DONE: a status code and a reason (cut to kMaxReasonBytes).
std::string EncodeStatus(char type, const Status& status);
// Fails when the message is malformed (kCorrupt) or not of `type`
// (kProtocol); else *verdict is the peer's status, its reason made printable.
Status DecodeStatus(std::string_view message, char type, Status* verdict);

// Chunks of chunk_bytes covering size_bytes; kOutOfRange past kMaxChunks or
// for a chunk size outside [kMinChunkBytes, kMaxChunkBytes].
Result<uint64_t> ChunkCount(uint64_t size_bytes, uint64_t chunk_bytes);

// The client's resume state, LOCAL.tern-part.state:
// "tern-part 1 SIZE XXH3HEX CHUNK_BYTES BITMAPHEX\n".
struct PartState {
  uint64_t size_bytes = 0;
  uint64_t xxh3 = 0;
  uint64_t chunk_bytes = 0;
  std::string bitmap;
};
std::string FormatPartState(const PartState& state);
// kCorrupt for anything that is not exactly that line with in-bound values
// (the caller still checks the bitmap fits its chunk map).
Result<PartState> ParsePartState(std::string_view text);

}  // namespace tern::xfer
