// HEAD beacon codec and signatures (docs/format/agent.md, "HEAD beacons").
#include "agent/freshness/beacon.h"

#include <cstring>

#include "base/coding.h"

namespace tern::agent {
namespace {

Status Validate(const HeadBeacon& b, Code code) {
  const char* why = nullptr;
  if (b.incarnation == 0)
    why = "incarnation 0";
  else if (b.seq == 0)
    why = "sequence number 0";
  else if (b.interval_ms == 0 || b.interval_ms > kMaxBeaconIntervalMs)
    why = "interval outside 1..600000 ms";
  else if (b.root_id.empty() || b.root_id.size() > kMaxBeaconRootIdBytes)
    why = "root id outside 1..256 bytes";
  if (why) return Status(code, std::string("HEAD beacon: ") + why);
  return Status::Ok();
}

}  // namespace

Result<std::string> EncodeBeacon(const HeadBeacon& b) {
  TERN_RETURN_IF_ERROR(Validate(b, Code::kInvalidArgument));
  std::string out(kBeaconMagic);
  PutFixed16(&out, b.head_epoch == 0 ? kBeaconFormat : kBeaconFormatEpoch);
  PutFixed16(&out, 0);
  out.append(reinterpret_cast<const char*>(b.board_id.data()), b.board_id.size());
  PutFixed64(&out, b.incarnation);
  PutFixed64(&out, b.seq);
  PutFixed64(&out, b.head);
  PutFixed64(&out, b.root_unix_ms);
  PutFixed32(&out, b.interval_ms);
  PutFixed16(&out, static_cast<uint16_t>(b.root_id.size()));
  PutFixed16(&out, 0);
  TERN_ASSERT(out.size() == kBeaconFixedBytes, "beacon layout drifted: ", out.size());
  if (b.head_epoch != 0) PutFixed32(&out, b.head_epoch);
  out.append(b.root_id);
  return out;
}

Result<HeadBeacon> DecodeBeacon(std::string_view in) {
  TERN_REQUIRE(in.size() >= kBeaconFixedBytes && in.size() <= kMaxBeaconBytes, kCorrupt,
               "HEAD beacon of ", in.size(), " bytes outside ", kBeaconFixedBytes, "..",
               kMaxBeaconBytes);
  TERN_REQUIRE(in.substr(0, kRecordMagicBytes) == kBeaconMagic, kCorrupt,
               "not a HEAD beacon (bad magic)");
  const uint64_t format = DecodeFixedAt(in, 8, 2);
  TERN_REQUIRE(format == kBeaconFormat || format == kBeaconFormatEpoch, kCorrupt,
               "HEAD beacon format ", format, " (this agent reads ", kBeaconFormat, " and ",
               kBeaconFormatEpoch, ")");
  const size_t fixed = format == kBeaconFormat ? kBeaconFixedBytes : kBeaconFixedBytesEpoch;
  TERN_REQUIRE(in.size() >= fixed, kCorrupt, "HEAD beacon format ", format, " of ", in.size(),
               " bytes, shorter than its ", fixed, "-byte header");
  TERN_REQUIRE(DecodeFixedAt(in, 10, 2) == 0 && DecodeFixedAt(in, 66, 2) == 0, kCorrupt,
               "HEAD beacon: reserved bytes not zero");
  HeadBeacon b;
  std::memcpy(b.board_id.data(), in.data() + 12, b.board_id.size());
  b.incarnation = DecodeFixedAt(in, 28, 8);
  b.seq = DecodeFixedAt(in, 36, 8);
  b.head = DecodeFixedAt(in, 44, 8);
  b.root_unix_ms = DecodeFixedAt(in, 52, 8);
  b.interval_ms = static_cast<uint32_t>(DecodeFixedAt(in, 60, 4));
  const uint64_t id_bytes = DecodeFixedAt(in, 64, 2);
  TERN_REQUIRE(in.size() == fixed + id_bytes, kCorrupt, "HEAD beacon of ", in.size(),
               " bytes with a root id of ", id_bytes, " bytes");
  if (format == kBeaconFormatEpoch) {
    b.head_epoch = static_cast<uint32_t>(DecodeFixedAt(in, 68, 4));
    // One encoding per beacon: epoch 0 is format 1.
    TERN_REQUIRE(b.head_epoch >= 1, kCorrupt, "HEAD beacon format 2 with epoch 0");
  }
  b.root_id.assign(in.substr(fixed));
  TERN_RETURN_IF_ERROR(Validate(b, Code::kCorrupt));
  return b;
}

Result<std::string> SignBeacon(const ManifestSigner& signer, const HeadBeacon& b) {
  TERN_ASSIGN_OR_RETURN(std::string record, EncodeBeacon(b));
  return signer.SignRecord(record);
}

Result<HeadBeacon> VerifyBeacon(const ManifestVerifier& verifier, std::string_view signed_bytes,
                                SignerStanding* signer) {
  if (signer != nullptr) *signer = SignerStanding::kNotRead;
  TERN_REQUIRE(signed_bytes.size() <= kMaxSignedBeaconBytes, kCorrupt, "signed HEAD beacon of ",
               signed_bytes.size(), " bytes (at most ", kMaxSignedBeaconBytes, ")");
  TERN_REQUIRE(signed_bytes.substr(0, kRecordMagicBytes) == kBeaconMagic, kCorrupt,
               "not a HEAD beacon (bad magic)");
  TERN_ASSIGN_OR_RETURN(std::string_view record, verifier.VerifyRecord(signed_bytes, signer));
  return DecodeBeacon(record);
}

}  // namespace tern::agent
