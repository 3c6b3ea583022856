#include "transport/ucx/wire.h"

#include "base/coding.h"
#include "base/wire_status.h"
#include "tern/transport.h"
#include "transport/internal.h"

namespace tern::ucx {

namespace {

constexpr uint32_t kKeyMagic = 0x594B5554;  // bytes "TUKY"
constexpr size_t kKeyFixedBytes = 4 + 2 + 2 + 8 + 8 + 4;

}  // namespace

std::string EncodeHello(const Hello& hello) {
  std::string out;
  PutFixed(&out, hello.magic, 4);
  PutFixed(&out, hello.version, 2);
  PutFixed(&out, 0, 2);
  return out;
}

Status DecodeHello(std::string_view bytes, Hello* out) {
  TERN_REQUIRE(bytes.size() == kHelloBytes, kProtocol, "ucx hello of ", bytes.size(),
               " bytes, expected ", kHelloBytes);
  out->magic = static_cast<uint32_t>(DecodeFixedAt(bytes, 0, 4));
  out->version = static_cast<uint16_t>(DecodeFixedAt(bytes, 4, 2));
  TERN_REQUIRE(out->magic == kMagic, kProtocol, "ucx hello with bad magic 0x", std::hex, out->magic);
  TERN_REQUIRE(out->version == kVersion, kProtocol, "peer speaks tern ucx protocol v", out->version,
               ", this side v", kVersion);
  TERN_REQUIRE(DecodeFixedAt(bytes, 6, 2) == 0, kProtocol, "ucx hello with reserved flags set");
  return Status::Ok();
}

std::string EncodeStatus(const StatusHeader& header) {
  std::string out;
  PutFixed(&out, header.op, 8);
  PutFixed(&out, header.code, 2);
  PutFixed(&out, 0, 2);
  PutFixed(&out, 0, 4);
  return out;
}

Status DecodeStatus(std::string_view bytes, StatusHeader* out) {
  TERN_REQUIRE(bytes.size() == kStatusBytes, kProtocol, "ucx status header of ", bytes.size(),
               " bytes, expected ", kStatusBytes);
  out->op = DecodeFixedAt(bytes, 0, 8);
  out->code = static_cast<uint16_t>(DecodeFixedAt(bytes, 8, 2));
  TERN_REQUIRE(out->code <= kMaxWireCode, kProtocol, "ucx status with unknown code ", out->code);
  TERN_REQUIRE(DecodeFixedAt(bytes, 10, 2) == 0 && DecodeFixedAt(bytes, 12, 4) == 0, kProtocol,
               "ucx status with reserved bytes set");
  return Status::Ok();
}

std::string EncodeMessage(uint64_t seq) {
  std::string out;
  PutFixed(&out, seq, 8);
  return out;
}

Status DecodeMessage(std::string_view bytes, uint64_t* seq) {
  TERN_REQUIRE(bytes.size() == kMessageBytes, kProtocol, "ucx message header of ", bytes.size(),
               " bytes, expected ", kMessageBytes);
  *seq = DecodeFixedAt(bytes, 0, 8);
  return Status::Ok();
}

std::string EncodeChunk(const ChunkHeader& header) {
  std::string out;
  PutFixed(&out, header.op, 8);
  PutFixed(&out, header.transfer_id, 8);
  PutFixed(&out, header.dst_offset, 8);
  PutFixed(&out, header.length, 8);
  PutFixed(&out, header.xxh3, 8);
  return out;
}

Status DecodeChunk(std::string_view bytes, uint64_t data_bytes, ChunkHeader* out) {
  TERN_REQUIRE(bytes.size() == kChunkBytes, kProtocol, "ucx chunk header of ", bytes.size(),
               " bytes, expected ", kChunkBytes);
  out->op = DecodeFixedAt(bytes, 0, 8);
  out->transfer_id = DecodeFixedAt(bytes, 8, 8);
  out->dst_offset = DecodeFixedAt(bytes, 16, 8);
  out->length = DecodeFixedAt(bytes, 24, 8);
  out->xxh3 = DecodeFixedAt(bytes, 32, 8);
  TERN_REQUIRE(out->length >= 1 && out->length <= kMaxChunkBytes, kProtocol, "ucx chunk of ",
               out->length, " bytes outside [1, ", kMaxChunkBytes, "]");
  TERN_REQUIRE(out->length == data_bytes, kProtocol, "ucx chunk header says ", out->length,
               " bytes but ", data_bytes, " arrived");
  return Status::Ok();
}

std::string EncodeRemoteKey(const RemoteKey& key) {
  std::string out;
  PutFixed(&out, kKeyMagic, 4);
  PutFixed(&out, kVersion, 2);
  PutFixed(&out, 0, 2);
  PutFixed(&out, key.base, 8);
  PutFixed(&out, key.size_bytes, 8);
  PutFixed(&out, key.rkey.size(), 4);
  out += key.rkey;
  return out;
}

Status DecodeRemoteKey(std::string_view bytes, RemoteKey* out) {
  TERN_REQUIRE(bytes.size() >= kKeyFixedBytes, kCorrupt, "ucx remote key of ", bytes.size(),
               " bytes is truncated");
  TERN_REQUIRE(DecodeFixedAt(bytes, 0, 4) == kKeyMagic, kCorrupt, "not a ucx remote key (bad magic)");
  TERN_REQUIRE(DecodeFixedAt(bytes, 4, 2) == kVersion, kProtocol, "ucx remote key version ", DecodeFixedAt(bytes, 4, 2),
               ", this side v", kVersion);
  TERN_REQUIRE(DecodeFixedAt(bytes, 6, 2) == 0, kCorrupt, "ucx remote key with reserved bytes set");
  out->base = DecodeFixedAt(bytes, 8, 8);
  out->size_bytes = DecodeFixedAt(bytes, 16, 8);
  const uint64_t rkey_bytes = DecodeFixedAt(bytes, 24, 4);
  TERN_REQUIRE(rkey_bytes >= 1 && rkey_bytes <= kMaxRkeyBytes, kCorrupt, "ucx rkey of ", rkey_bytes,
               " bytes outside [1, ", kMaxRkeyBytes, "]");
  TERN_REQUIRE(bytes.size() == kKeyFixedBytes + rkey_bytes, kCorrupt, "ucx remote key of ",
               bytes.size(), " bytes, its header says ", kKeyFixedBytes + rkey_bytes);
  TERN_REQUIRE(out->base + out->size_bytes >= out->base, kCorrupt,
               "ucx remote key region wraps the address space");
  out->rkey.assign(bytes.substr(kKeyFixedBytes));
  return Status::Ok();
}

}  // namespace tern::ucx
