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
      // Within epoch 0 numbers order the chain; from epoch 1 on a squash may
      // start at a withdrawn number above parent (a member left there), so
      // the codec only keeps it off the patch's and the keyframe's edges and
      // the board checks that it starts before parent on the chain.
      if (m.epoch == 0) {
        TERN_REQUIRE(o.from_version < m.parent && o.to_version == m.version, kMismatch,
                     "manifest object ", i, ": squash ", o.from_version, "->", o.to_version,
                     " must start before parent ", m.parent, " and end at version ", m.version);
      } else {
        TERN_REQUIRE(
            o.from_version != m.parent && o.from_version != m.version && o.to_version == m.version,
            kMismatch, "manifest object ", i, ": squash ", o.from_version, "->", o.to_version,
            " must start neither at parent ", m.parent, " nor at version ", m.version,
            " and end at version ", m.version);
      }
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

Status ValidateFiles(const VersionManifest& m) {
  TERN_REQUIRE(m.files.size() <= kMaxManifestFiles, kMismatch, "manifest names ", m.files.size(),
               " model files, more than ", kMaxManifestFiles);
  uint64_t total = 0;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    TERN_REQUIRE(ValidModelFileName(f.name), kMismatch, "manifest file ", i, ": \"",
                 f.name.substr(0, kMaxManifestFileNameBytes),
                 "\" is not a model file name (1..128 bytes, no '/', no leading '.', not a "
                 "tensor file or the safetensors index)");
    TERN_REQUIRE(f.bytes <= kMaxManifestFileBytes, kMismatch, "manifest file ", f.name, ": ",
                 f.bytes, " bytes, more than ", kMaxManifestFileBytes);
    total += f.bytes;
    TERN_REQUIRE(i == 0 || m.files[i - 1].name < f.name, kMismatch, "manifest file ", i,
                 ": files not in strict name order");
  }
  TERN_REQUIRE(total <= kMaxManifestFilesTotalBytes, kMismatch, "manifest files hold ", total,
               " bytes, more than ", kMaxManifestFilesTotalBytes);
  return Status::Ok();
}

bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

}  // namespace

bool ValidModelFileName(std::string_view name) {
  if (name.empty() || name.size() > kMaxManifestFileNameBytes || name[0] == '.') return false;
  for (char c : name)
    if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  return !EndsWith(name, ".safetensors") && !EndsWith(name, ".safetensors.index.json");
}

Result<size_t> ManifestBytesOf(std::string_view in) {
  TERN_REQUIRE(in.size() >= kManifestHeaderBytes, kCorrupt, "manifest of ", in.size(),
               " bytes is shorter than its ", kManifestHeaderBytes, "-byte header");
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  TERN_REQUIRE(std::memcmp(p, kMagic, sizeof(kMagic)) == 0, kCorrupt,
               "not a tern manifest (bad magic)");
  const uint16_t format = DecodeFixed16(p + 8);
  TERN_REQUIRE(format >= kManifestFormat && format <= kManifestFormatEpoch, kCorrupt,
               "manifest format ", format, " is not one of the supported ", kManifestFormat, "..",
               kManifestFormatEpoch);
  const uint32_t count = DecodeFixed32(p + 120);
  TERN_REQUIRE(count >= 1 && count <= kMaxManifestObjects, kCorrupt, "manifest object count ",
               count, " outside [1, ", kMaxManifestObjects, "]");
  size_t bytes = kManifestHeaderBytes + kManifestObjectBytes * count;
  if (format == kManifestFormat) {
    TERN_REQUIRE(DecodeFixed32(p + 124) == 0, kCorrupt, "manifest reserved count field not zero");
    return bytes;
  }
  // Format 2 names at least one file (one without is written as format 1:
  // one encoding per manifest); format 3 may name none (it says the epoch).
  const uint16_t files = DecodeFixed16(p + 124);
  const uint16_t names = DecodeFixed16(p + 126);
  const uint16_t min_files = format == kManifestFormatFiles ? 1 : 0;
  TERN_REQUIRE(files >= min_files && files <= kMaxManifestFiles, kCorrupt, "manifest file count ",
               files, " outside [", min_files, ", ", kMaxManifestFiles, "]");
  TERN_REQUIRE(names >= files && names <= files * kMaxManifestFileNameBytes, kCorrupt,
               "manifest file names of ", names, " bytes for ", files, " files");
  return bytes + kManifestFileBytes * files + names;
}

Status ValidateManifest(const VersionManifest& m) {
  TERN_REQUIRE(m.version >= 1, kMismatch, "manifest version 0 is reserved");
  if (m.supersede) {
    TERN_REQUIRE(m.epoch >= 1, kMismatch, "manifest of version ", m.version,
                 ": a supersede opens an epoch >= 1, not epoch 0");
    TERN_REQUIRE(m.parent >= 1 && m.version < m.parent, kMismatch, "manifest of version ",
                 m.version, ": a supersede renumbers below its parent ", m.parent);
    const auto names = [&](ObjectKind kind, uint64_t from) {
      for (const ManifestObject& o : m.objects)
        if (o.kind == kind && o.from_version == from) return true;
      return false;
    };
    TERN_REQUIRE(names(ObjectKind::kPatch, m.parent) && names(ObjectKind::kKeyframe, m.version),
                 kMismatch, "manifest of version ", m.version,
                 ": a supersede names patch(parent->version) and keyframe(version)");
  } else {
    TERN_REQUIRE(m.parent < m.version, kMismatch, "manifest parent ", m.parent,
                 " is not older than version ", m.version);
  }
  TERN_REQUIRE(!m.objects.empty(), kMismatch, "manifest of version ", m.version,
               " names no object");
  TERN_REQUIRE(m.objects.size() <= kMaxManifestObjects, kMismatch, "manifest names ",
               m.objects.size(), " objects, more than ", kMaxManifestObjects);
  for (size_t i = 0; i < m.objects.size(); ++i) TERN_RETURN_IF_ERROR(ValidateObject(m, i));
  return ValidateFiles(m);
}

Result<std::string> EncodeManifest(const VersionManifest& m) {
  TERN_RETURN_IF_ERROR(ValidateManifest(m));
  std::string out;
  size_t names = 0;
  for (const ManifestFile& f : m.files) names += f.name.size();
  out.reserve(kManifestHeaderBytes + kManifestObjectBytes * m.objects.size() +
              kManifestFileBytes * m.files.size() + names);
  out.append(kMagic, sizeof(kMagic));
  const uint16_t format = m.epoch >= 1      ? kManifestFormatEpoch
                          : m.files.empty() ? kManifestFormat
                                            : kManifestFormatFiles;
  PutFixed16(&out, format);
  PutFixed16(&out, m.supersede ? 1 : 0);  // flags; only format 3 (ValidateManifest)
  PutFixed32(&out, m.epoch);              // formats 1 and 2: reserved, 0
  out.append(reinterpret_cast<const char*>(m.board_id.data()), m.board_id.size());
  PutFixed64(&out, m.version);
  PutFixed64(&out, m.parent);
  PutFixed64(&out, m.created_unix_ms);
  for (const ViewDigest* d : {&m.base_digest, &m.target_digest}) {
    const auto b = d->Bytes();
    out.append(reinterpret_cast<const char*>(b.data()), b.size());
  }
  PutFixed32(&out, static_cast<uint32_t>(m.objects.size()));
  PutFixed16(&out, static_cast<uint16_t>(m.files.size()));  // format 1: reserved, 0
  PutFixed16(&out, static_cast<uint16_t>(names));
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
  for (const ManifestFile& f : m.files) {
    PutFixed64(&out, f.bytes);
    PutFixed16(&out, static_cast<uint16_t>(f.name.size()));
    PutFixed16(&out, 0);  // reserved
    PutFixed32(&out, 0);  // reserved
    out.append(reinterpret_cast<const char*>(f.sha256.data()), 32);
  }
  for (const ManifestFile& f : m.files) out += f.name;
  return out;
}

Result<VersionManifest> DecodeManifest(std::string_view in) {
  TERN_ASSIGN_OR_RETURN(const size_t want, ManifestBytesOf(in));
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  const uint16_t format = DecodeFixed16(p + 8);
  const uint16_t flags = DecodeFixed16(p + 10);
  VersionManifest m;
  if (format == kManifestFormatEpoch) {
    TERN_REQUIRE((flags & ~1u) == 0, kCorrupt, "manifest flags ", flags,
                 ": only bit 0 (supersede) is defined");
    m.epoch = DecodeFixed32(p + 12);
    TERN_REQUIRE(m.epoch >= 1, kCorrupt, "manifest format 3 with epoch 0 (epoch 0 is written ",
                 "as format 1 or 2)");
    m.supersede = (flags & 1) != 0;
  } else {
    TERN_REQUIRE(flags == 0, kCorrupt, "manifest flags ", flags, " must be 0");
    TERN_REQUIRE(DecodeFixed32(p + 12) == 0, kCorrupt, "manifest reserved header field not zero");
  }
  std::memcpy(m.board_id.data(), p + 16, 16);
  m.version = DecodeFixed64(p + 32);
  m.parent = DecodeFixed64(p + 40);
  m.created_unix_ms = DecodeFixed64(p + 48);
  m.base_digest = ViewDigest::FromBytes(p + 56);
  m.target_digest = ViewDigest::FromBytes(p + 88);
  const uint32_t count = DecodeFixed32(p + 120);
  const uint32_t file_count = format == kManifestFormat ? 0 : DecodeFixed16(p + 124);
  TERN_REQUIRE(in.size() == want, kCorrupt, "manifest of ", count, " objects and ", file_count,
               " files is ", want, " bytes, got ", in.size());
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
  const uint8_t* file_at = p + kManifestHeaderBytes + kManifestObjectBytes * count;
  const size_t names_at = kManifestHeaderBytes + kManifestObjectBytes * count + kManifestFileBytes * file_count;
  size_t name_at = names_at;
  m.files.resize(file_count);
  for (uint32_t i = 0; i < file_count; ++i) {
    const uint8_t* q = file_at + kManifestFileBytes * i;
    ManifestFile& f = m.files[i];
    f.bytes = DecodeFixed64(q);
    const uint16_t name_bytes = DecodeFixed16(q + 8);
    TERN_REQUIRE(DecodeFixed16(q + 10) == 0 && DecodeFixed32(q + 12) == 0, kCorrupt,
                 "manifest file ", i, ": reserved field not zero");
    TERN_REQUIRE(name_bytes >= 1 && name_bytes <= kMaxManifestFileNameBytes &&
                     name_bytes <= in.size() - name_at,
                 kCorrupt, "manifest file ", i, ": name of ", name_bytes,
                 " bytes outside its block");
    std::memcpy(f.sha256.data(), q + 16, 32);
    f.name.assign(in.data() + name_at, name_bytes);
    name_at += name_bytes;
  }
  TERN_REQUIRE(name_at == in.size(), kCorrupt, "manifest file names are ", name_at - names_at,
               " bytes, the header announces ", in.size() - names_at);
  TERN_RETURN_IF_ERROR(ValidateManifest(m));
  return m;
}

}  // namespace tern
