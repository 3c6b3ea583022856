// The xfer application protocol behind `tern xfer` (docs/format/xfer.md,
// version 3) and the client's resume-state file, as pure encoders and
// decoders: the file server and FetchFile parse peer bytes only through
// these, and the fuzzers drive them directly. Every length and count is
// bounded before it is used.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tern/status.h"

namespace tern::xfer {

inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kMaxNameBytes = 4096;
inline constexpr uint32_t kMaxReasonBytes = 4096;
inline constexpr uint32_t kMaxAccessTokenBytes = 1024;
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
inline constexpr char kHash = 'H';

// INFO flags.
inline constexpr uint8_t kInfoHashKnown = 1;  // Info::xxh3 is the whole-file hash
inline constexpr uint8_t kInfoSending = 2;    // resume accepted: chunks follow without WANT
inline constexpr uint8_t kInfoHead = 4;       // the head window's chunks follow without WANT
// A head window covers at most this much of a fresh partial file.
inline constexpr uint64_t kMaxHeadBytes = uint64_t{1} << 30;

// 0 for an empty message.
inline char TypeOf(std::string_view message) { return message.empty() ? '\0' : message[0]; }

struct GetRequest {
  uint64_t chunk_bytes = 0;  // kMinChunkBytes .. kMaxChunkBytes
  uint64_t transfer_id = 0;  // non-zero: the client's receive window
  std::string name;          // 1 .. kMaxNameBytes, no NUL
  // The version the client holds a partial copy of (have_tag 0: none, then
  // have_size is 0 and have_bitmap empty) and the chunks it has: exactly
  // ceil(chunks / 8) bytes, no bits past the last chunk.
  uint64_t have_size = 0;
  uint64_t have_tag = 0;
  std::string have_bitmap;
  // With have_tag 0: the client's window covers [0, head_bytes) of its
  // partial file (0: no window); a multiple of chunk_bytes <= kMaxHeadBytes.
  uint64_t head_bytes = 0;
  // The server's access token (0 .. kMaxAccessTokenBytes); a server that has
  // one sends nothing to a GET without it.
  std::string access_token{};
};
struct Info {
  uint64_t size_bytes = 0;
  uint64_t tag = 0;  // non-zero: names this version of the file
  uint64_t transfer_id = 0;
  uint8_t flags = 0;  // kInfoHashKnown | kInfoSending | kInfoHead
  uint64_t xxh3 = 0;  // 0 unless kInfoHashKnown
  bool hash_known() const { return flags & kInfoHashKnown; }
  bool sending() const { return flags & kInfoSending; }
  bool head() const { return flags & kInfoHead; }
};
struct HashMsg {
  uint64_t transfer_id = 0;
  uint64_t xxh3 = 0;
};
struct Want {
  uint64_t transfer_id = 0;
  std::string bitmap;  // ChunkMap::bits() of the chunks the client has
};

std::string EncodeGet(const GetRequest& get);
// kProtocol for another xfer version; kOutOfRange for a chunk size outside
// its bounds or a have_size past kMaxChunks; kInvalidArgument for an empty
// name or one with NUL; kCorrupt for anything malformed (a zero transfer
// id, a have part inconsistent with have_tag, a bitmap of the wrong length
// or with bits past the last chunk, a head with have_tag set, not a chunk
// multiple or past kMaxHeadBytes).
Result<GetRequest> DecodeGet(std::string_view message);

std::string EncodeInfo(const Info& info);
// kCorrupt for a zero tag or transfer id, unknown flag bits, SENDING with
// HEAD, or a hash with kInfoHashKnown clear.
Result<Info> DecodeInfo(std::string_view message);

std::string EncodeHash(const HashMsg& hash);
Result<HashMsg> DecodeHash(std::string_view message);

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

// kCorrupt unless `bitmap` is exactly the bitmap of `chunks` chunks: ceil(chunks / 8)
// bytes, no bit set past the last chunk.
Status CheckBitmap(std::string_view bitmap, uint64_t chunks);

// The client's resume state, LOCAL.tern-part.state:
// "tern-part 2 SIZE TAGHEX XXH3HEX|- CHUNK_BYTES BITMAPHEX\n".
struct PartState {
  uint64_t size_bytes = 0;
  uint64_t tag = 0;  // non-zero
  bool hash_known = false;
  uint64_t xxh3 = 0;  // 0 unless hash_known
  uint64_t chunk_bytes = 0;
  std::string bitmap;
};
// The longest valid resume-state line (the reader's bound before parsing).
inline constexpr uint64_t kMaxPartStateBytes = 128 + 2 * (kMaxChunks / 8);
std::string FormatPartState(const PartState& state);
// kCorrupt for anything that is not exactly that line with in-bound values
// (the caller still checks the bitmap fits its chunk map).
Result<PartState> ParsePartState(std::string_view text);

}  // namespace tern::xfer
