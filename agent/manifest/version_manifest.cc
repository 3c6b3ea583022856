// The canonical manifest codec (docs/format/agent.md §2-3). Decode reads
// untrusted bytes: every field is checked, every count bounded, and the
// consistency rules are shared with Encode (ValidateManifest) so that the
// two cannot drift apart.
#include "tern/version_manifest.h"

#include <cstring>

#include "base/coding.h"
#include "tern/transport.h"

namespace tern {
namespace {

constexpr char kMagic[8] = {'T', 'E', 'R', 'N', 'M', 'A', 'N', 'I'};
static_assert(std::string_view(kMagic, sizeof(kMagic)) == kManifestMagic);

const char* KindName(ObjectKind k) {
  switch (k) {
    case ObjectKind::kPatch: return "patch";
    case ObjectKind::kKeyframe: return "keyframe";
    case ObjectKind::kSquash: return "squash";
  }
  return "unknown";
}

Status ValidateObject(const VersionManifest& m, size_t i) {
  const ManifestObject& o = m.objects[i];
  const char* kind = KindName(o.kind);
  switch (o.kind) {
    case ObjectKind::kPatch:
      TERN_REQUIRE(o.from_version == m.parent && o.to_version == m.version, kMismatch,
                   "manifest object ", i, ": patch ", o.from_version, "->", o.to_version,
                   " is not parent->version ", m.parent, "->", m.version);
      break;
    case ObjectKind::kKeyframe:
      TERN_REQUIRE(o.from_version == m.version && o.to_version == m.version, kMismatch,
                   "manifest object ", i, ": keyframe ", o.from_version, "->", o.to_version,
                   " is not of version ", m.version);
      break;
    case ObjectKind::kSquash:
      TERN_REQUIRE(o.from_version < m.parent && o.to_version == m.version, kMismatch,
                   "manifest object ", i, ": squash ", o.from_version, "->", o.to_version,
                   " must start before parent ", m.parent, " and end at version ", m.version);
      break;
    default:
      return TERN_ERROR(kCorrupt, "manifest object ", i, ": unknown kind ",
                        static_cast<int>(o.kind));
  }
  TERN_REQUIRE(o.chunk_bytes >= 1 && o.chunk_bytes <= kMaxChunkBytes, kMismatch,
               "manifest object ", i, " (", kind, "): chunk_bytes ", o.chunk_bytes,
               " outside [1, ", kMaxChunkBytes, "]");
  TERN_REQUIRE(o.bytes >= 1, kMismatch, "manifest object ", i, " (", kind, "): empty object");
  const uint64_t chunks = (o.bytes - 1) / o.chunk_bytes + 1;  // no overflow
  TERN_REQUIRE(chunks <= kMaxManifestChunks, kMismatch, "manifest object ", i, " (", kind,
               "): ", chunks, " chunks exceed the bound ", kMaxManifestChunks);
  TERN_REQUIRE(o.chunk_count == chunks, kMismatch, "manifest object ", i, " (", kind,
               "): chunk_count ", o.chunk_count, " but ", o.bytes, " bytes in chunks of ",
               o.chunk_bytes, " make ", chunks);
  if (i > 0) {
    const ManifestObject& p = m.objects[i - 1];
    const bool ordered = p.kind < o.kind || (p.kind == o.kind && p.from_version < o.from_version);
    TERN_REQUIRE(ordered, kMismatch, "manifest object ", i,
                 ": objects not in strict (kind, from_version) order");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateManifest(const VersionManifest& m) {
  TERN_REQUIRE(m.version >= 1, kMismatch, "manifest version 0 is reserved");
  TERN_REQUIRE(m.parent < m.version, kMismatch, "manifest parent ", m.parent,
               " is not older than version ", m.version);
  TERN_REQUIRE(!m.objects.empty(), kMismatch, "manifest of version ", m.version,
               " names no object");
  TERN_REQUIRE(m.objects.size() <= kMaxManifestObjects, kMismatch, "manifest names ",
               m.objects.size(), " objects, more than ", kMaxManifestObjects);
  for (size_t i = 0; i < m.objects.size(); ++i) TERN_RETURN_IF_ERROR(ValidateObject(m, i));
  return Status::Ok();
}

Result<std::string> EncodeManifest(const VersionManifest& m) {
  TERN_RETURN_IF_ERROR(ValidateManifest(m));
  std::string out;
  out.reserve(kManifestHeaderBytes + kManifestObjectBytes * m.objects.size());
  out.append(kMagic, sizeof(kMagic));
  PutFixed16(&out, kManifestFormat);
  PutFixed16(&out, 0);  // flags
  PutFixed32(&out, 0);  // reserved
  out.append(reinterpret_cast<const char*>(m.board_id.data()), m.board_id.size());
  PutFixed64(&out, m.version);
  PutFixed64(&out, m.parent);
  PutFixed64(&out, m.created_unix_ms);
  for (const ViewDigest* d : {&m.base_digest, &m.target_digest}) {
    const auto b = d->Bytes();
    out.append(reinterpret_cast<const char*>(b.data()), b.size());
  }
  PutFixed32(&out, static_cast<uint32_t>(m.objects.size()));
  PutFixed32(&out, 0);  // reserved
  TERN_ASSERT(out.size() == kManifestHeaderBytes);
  for (const ManifestObject& o : m.objects) {
    out.push_back(static_cast<char>(o.kind));
    out.append(3, '\0');  // reserved
    PutFixed32(&out, o.chunk_bytes);
    PutFixed64(&out, o.from_version);
    PutFixed64(&out, o.to_version);
    PutFixed64(&out, o.bytes);
    PutFixed32(&out, o.chunk_count);
    PutFixed32(&out, 0);  // reserved
    out.append(reinterpret_cast<const char*>(o.chunk_hashes_root.data()), 32);
  }
  return out;
}

Result<VersionManifest> DecodeManifest(std::string_view in) {
  TERN_REQUIRE(in.size() >= kManifestHeaderBytes, kCorrupt, "manifest of ", in.size(),
               " bytes is shorter than its ", kManifestHeaderBytes, "-byte header");
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  TERN_REQUIRE(std::memcmp(p, kMagic, sizeof(kMagic)) == 0, kCorrupt,
               "not a tern manifest (bad magic)");
  const uint16_t format = DecodeFixed16(p + 8);
  TERN_REQUIRE(format == kManifestFormat, kCorrupt, "manifest format ", format,
               " is not the supported ", kManifestFormat);
  TERN_REQUIRE(DecodeFixed16(p + 10) == 0, kCorrupt, "manifest flags ", DecodeFixed16(p + 10),
               " must be 0");
  TERN_REQUIRE(DecodeFixed32(p + 12) == 0, kCorrupt, "manifest reserved header field not zero");
  VersionManifest m;
  std::memcpy(m.board_id.data(), p + 16, 16);
  m.version = DecodeFixed64(p + 32);
  m.parent = DecodeFixed64(p + 40);
  m.created_unix_ms = DecodeFixed64(p + 48);
  m.base_digest = ViewDigest::FromBytes(p + 56);
  m.target_digest = ViewDigest::FromBytes(p + 88);
  const uint32_t count = DecodeFixed32(p + 120);
  TERN_REQUIRE(DecodeFixed32(p + 124) == 0, kCorrupt, "manifest reserved count field not zero");
  TERN_REQUIRE(count >= 1 && count <= kMaxManifestObjects, kCorrupt, "manifest object count ",
               count, " outside [1, ", kMaxManifestObjects, "]");
  const size_t want = kManifestHeaderBytes + kManifestObjectBytes * count;
  TERN_REQUIRE(in.size() == want, kCorrupt, "manifest of ", count, " objects is ", want,
               " bytes, got ", in.size());
  m.objects.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    const uint8_t* q = p + kManifestHeaderBytes + kManifestObjectBytes * i;
    ManifestObject& o = m.objects[i];
    TERN_REQUIRE(q[0] >= 1 && q[0] <= 3, kCorrupt, "manifest object ", i, ": unknown kind ",
                 static_cast<int>(q[0]));
    TERN_REQUIRE(q[1] == 0 && q[2] == 0 && q[3] == 0 && DecodeFixed32(q + 36) == 0, kCorrupt,
                 "manifest object ", i, ": reserved field not zero");
    o.kind = static_cast<ObjectKind>(q[0]);
    o.chunk_bytes = DecodeFixed32(q + 4);
    o.from_version = DecodeFixed64(q + 8);
    o.to_version = DecodeFixed64(q + 16);
    o.bytes = DecodeFixed64(q + 24);
    o.chunk_count = DecodeFixed32(q + 32);
    std::memcpy(o.chunk_hashes_root.data(), q + 40, 32);
  }
  TERN_RETURN_IF_ERROR(ValidateManifest(m));
  return m;
}

}  // namespace tern
