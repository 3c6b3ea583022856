#include "patch/container.h"

#include <xxhash.h>

#include <cstring>

#include "base/coding.h"
#include "patch/context_codec.h"

namespace tern::patch {
namespace {

uint64_t TrailerChecksum(uint64_t record_count, uint64_t manifest_checksum,
                         const std::vector<uint64_t>& record_checksums) {
  std::vector<uint8_t> buf(kTrailerMagic, kTrailerMagic + 8);
  PutFixed64(&buf, record_count);
  PutFixed64(&buf, manifest_checksum);
  for (uint64_t c : record_checksums) PutFixed64(&buf, c);
  return XXH3_64bits(buf.data(), buf.size());
}

Status ParseManifest(const uint8_t* p, uint64_t n, ParsedPatch* out) {
  TERN_REQUIRE(n >= sizeof(ManifestFixed), kCorrupt, "manifest too short");
  ManifestFixed m;
  std::memcpy(&m, p, sizeof(m));
  TERN_REQUIRE(m.reserved == 0, kCorrupt, "manifest: reserved field not zero");
  TERN_REQUIRE(m.tensor_count <= kMaxTensors, kCorrupt, "manifest: ", m.tensor_count, " tensors exceeds limit");
  TERN_REQUIRE(m.tensor_count <= (n - sizeof(ManifestFixed)) / (kTensorEntryFixedBytes + 17), kCorrupt,
               "manifest: tensor count ", m.tensor_count, " does not fit its size");
  out->base_version = m.base_version;
  out->target_version = m.target_version;
  out->base_digest = ViewDigest::FromBytes(m.base_digest);
  out->target_digest = ViewDigest::FromBytes(m.target_digest);
  out->tensors.reserve(m.tensor_count);
  uint64_t at = sizeof(ManifestFixed);
  for (uint32_t t = 0; t < m.tensor_count; ++t) {
    TERN_REQUIRE(n - at >= kTensorEntryFixedBytes, kCorrupt, "manifest: truncated tensor entry ", t);
    const uint16_t name_bytes = DecodeFixed16(p + at);
    const uint8_t dtype = p[at + 2], rank = p[at + 3], coding = p[at + 4];
    TERN_REQUIRE(p[at + 5] == 0 && p[at + 6] == 0 && p[at + 7] == 0, kCorrupt, "manifest: tensor ", t,
                 " reserved field not zero");
    TERN_REQUIRE(coding == kCodingElements || (coding == kCodingNibbles && out->format_version >= kFormatVersion3),
                 kCorrupt, "manifest: tensor ", t,
                 out->format_version >= kFormatVersion3 ? " unknown coding " : " reserved field not zero",
                 out->format_version >= kFormatVersion3 ? std::to_string(coding) : std::string());
    TERN_REQUIRE(name_bytes >= 1 && name_bytes <= kMaxNameBytes, kCorrupt, "manifest: tensor ", t,
                 " name length ", name_bytes);
    TERN_REQUIRE(DTypeValid(dtype), kCorrupt, "manifest: tensor ", t, " unknown dtype code ", int{dtype});
    TERN_REQUIRE(rank <= kMaxRank, kCorrupt, "manifest: tensor ", t, " rank ", int{rank}, " exceeds limit");
    at += kTensorEntryFixedBytes;
    const uint64_t need = uint64_t{name_bytes} + 8ull * rank + 16;
    TERN_REQUIRE(n - at >= need, kCorrupt, "manifest: truncated tensor entry ", t);
    ManifestTensor mt;
    mt.desc.name.assign(reinterpret_cast<const char*>(p + at), name_bytes);
    mt.desc.dtype = static_cast<DType>(dtype);
    at += name_bytes;
    for (int r = 0; r < rank; ++r, at += 8) mt.desc.shape.push_back(DecodeFixed64(p + at));
    mt.elements = DecodeFixed64(p + at);
    mt.segment_count = DecodeFixed64(p + at + 8);
    at += 16;
    auto checked = CheckedElements(mt.desc.dtype, mt.desc.shape);
    TERN_REQUIRE(checked.ok() && *checked == mt.elements, kCorrupt, "manifest: tensor '", mt.desc.name,
                 "' element count does not match its shape");
    TERN_REQUIRE(mt.segment_count <= mt.elements, kCorrupt, "manifest: tensor '", mt.desc.name,
                 "' has more segments than elements");
    TERN_REQUIRE(out->tensors.empty() || out->tensors.back().desc.name < mt.desc.name, kCorrupt,
                 "manifest: tensor names not strictly sorted at '", mt.desc.name, "'");
    mt.width_bits = ElementBits(mt.desc.dtype);
    mt.context = ContextFieldOf(mt.desc.dtype);
    mt.code_bits = mt.width_bits;
    mt.code_elements = mt.elements;
    if (coding == kCodingNibbles) {
      TERN_REQUIRE(NibbleCodable(mt.desc.dtype), kCorrupt, "manifest: tensor '", mt.desc.name, "' (",
                   DTypeName(mt.desc.dtype), ") cannot be coded as nibbles");
      mt.nibbles = true;
      mt.code_bits = 4;
      mt.code_elements = mt.elements * static_cast<uint64_t>(mt.width_bits / 4);  // elements <= 2^59
      mt.context = ContextField{};  // no CONTEXT records
    }
    out->tensors.push_back(std::move(mt));
  }
  TERN_REQUIRE(at == n, kCorrupt, "manifest: ", n - at, " trailing bytes");
  return Status::Ok();
}

// Header and manifest. With `prefix` set, *at is how far they are complete
// (0 or the header's size) and *complete false when `in` ends before them.
Status WalkHead(std::span<const uint8_t> in, bool prefix, ParsedPatch* out, uint64_t* at,
                uint64_t* manifest_sum, bool* complete) {
  const uint8_t* p = in.data();
  const uint64_t size = in.size();
  *at = 0;
  *complete = false;
  if (size < sizeof(FileHeader)) {
    if (prefix) return Status::Ok();
    return TERN_ERROR(kCorrupt, "truncated patch: ", size, " bytes, no file header");
  }
  FileHeader fh;
  std::memcpy(&fh, p, sizeof(fh));
  TERN_REQUIRE(std::memcmp(fh.magic, kMagic, 8) == 0, kCorrupt, "not a tern patch (bad magic)");
  TERN_REQUIRE(XXH3_64bits(p, 24) == fh.checksum, kCorrupt, "patch file header checksum mismatch");
  TERN_REQUIRE(fh.version >= kFormatVersion1 && fh.version <= kNewestFormatVersion, kUnsupported,
               "patch format version ", fh.version, " (this build reads versions 1 to 3)");
  TERN_REQUIRE(fh.flags == 0 && fh.reserved == 0, kCorrupt, "patch header: reserved bits not zero");
  TERN_REQUIRE(fh.manifest_bytes >= sizeof(ManifestFixed) && fh.manifest_bytes <= kMaxManifestBytes, kCorrupt,
               "patch header: manifest size ", fh.manifest_bytes, " out of range");
  out->format_version = fh.version;
  *at = sizeof(FileHeader);
  if (size - *at < fh.manifest_bytes + kChecksumBytes) {
    if (prefix) return Status::Ok();
    return TERN_ERROR(kCorrupt, "truncated patch: manifest needs ", fh.manifest_bytes, " bytes");
  }
  *manifest_sum = DecodeFixed64(p + *at + fh.manifest_bytes);
  TERN_REQUIRE(XXH3_64bits(p + *at, fh.manifest_bytes) == *manifest_sum, kCorrupt,
               "manifest checksum mismatch");
  TERN_RETURN_IF_ERROR(ParseManifest(p + *at, fh.manifest_bytes, out));
  *at += fh.manifest_bytes + kChecksumBytes;
  out->container_bytes = sizeof(FileHeader) + fh.manifest_bytes + kChecksumBytes + sizeof(Trailer);
  *complete = true;
  return Status::Ok();
}

// Walks the units; with `prefix` set, an incomplete unit ends the walk
// successfully and *verified says how far it got.
Status Walk(std::span<const uint8_t> in, ParsedPatch* out, uint64_t* verified) {
  const bool prefix = verified != nullptr;
  const uint8_t* p = in.data();
  const uint64_t size = in.size();
  auto stop = [&](uint64_t at) {
    *verified = at;
    return Status::Ok();
  };
  uint64_t at = 0, manifest_sum = 0;
  bool head_complete = false;
  TERN_RETURN_IF_ERROR(WalkHead(in, prefix, out, &at, &manifest_sum, &head_complete));
  if (!head_complete) return stop(at);

  uint64_t record_total = 0;
  for (const auto& t : out->tensors) {
    record_total += t.segment_count;
    // Each record takes at least header + checksum bytes: bounds the
    // reservation below by the input size. (A prefix walk only advances over
    // bytes present, so it needs no such bound: it stops at the first
    // incomplete record long before any huge count matters.)
    TERN_REQUIRE(prefix || record_total <= size / (sizeof(RecordHeader) + kChecksumBytes), kCorrupt,
                 "manifest: segment counts exceed what the patch could hold");
  }
  if (!prefix) out->records.reserve(record_total);
  std::vector<uint64_t> sums;
  sums.reserve(prefix ? 0 : record_total);
  RecordCursor cursor;
  cursor.at = at;
  for (;;) {
    RecordView rec;
    TERN_ASSIGN_OR_RETURN(NextRecordResult next, NextRecord(in, *out, &cursor, &rec));
    if (next == NextRecordResult::kEnd) break;
    if (next == NextRecordResult::kIncomplete) {
      if (prefix) return stop(cursor.at);
      // ParseRecord's own error names what is missing.
      const ManifestTensor& mt = out->tensors[cursor.tensor];
      auto rec_again = ParseRecord(p + cursor.at, size - cursor.at, mt.code_bits, nullptr,
                                   out->format_version >= kFormatVersion2 && mt.context.ok);
      TERN_ASSERT(!rec_again.ok(), "NextRecord found a complete record incomplete");
      return rec_again.status().WithContext("tensor '" + mt.desc.name + "'");
    }
    sums.push_back(rec.checksum);
    if (!prefix) out->records.push_back(rec);
  }
  at = cursor.at;
  if (size - at < sizeof(Trailer)) {
    if (prefix) return stop(at);
    return TERN_ERROR(kCorrupt, "truncated patch: trailer missing");
  }
  Trailer tr;
  std::memcpy(&tr, p + at, sizeof(tr));
  TERN_REQUIRE(std::memcmp(tr.magic, kTrailerMagic, 8) == 0, kCorrupt, "patch trailer: bad magic");
  TERN_REQUIRE(tr.record_count == record_total, kCorrupt, "patch trailer: record count mismatch");
  TERN_REQUIRE(tr.checksum == TrailerChecksum(record_total, manifest_sum, sums), kCorrupt,
               "patch trailer checksum mismatch");
  at += sizeof(Trailer);
  TERN_REQUIRE(at == size, kCorrupt, "patch: ", size - at, " bytes after the trailer");
  out->total_bytes = size;
  if (prefix) *verified = at;
  return Status::Ok();
}

}  // namespace

bool NibbleCodable(DType dtype) {
  switch (dtype) {
    case DType::kU8:
    case DType::kI8:
    case DType::kU16:
    case DType::kI16:
    case DType::kU32:
    case DType::kI32:
    case DType::kU64:
    case DType::kI64:
      return true;
    default:
      return false;
  }
}

Result<ParsedPatch> ParsePatch(std::span<const uint8_t> patch) {
  ParsedPatch out;
  TERN_RETURN_IF_ERROR(Walk(patch, &out, nullptr));
  return out;
}

Result<uint64_t> ParsePrefix(std::span<const uint8_t> prefix) {
  ParsedPatch out;
  uint64_t verified = 0;
  TERN_RETURN_IF_ERROR(Walk(prefix, &out, &verified));
  return verified;
}

Result<bool> ParseHead(std::span<const uint8_t> prefix, ParsedPatch* out, uint64_t* records_at) {
  uint64_t manifest_sum = 0;
  bool complete = false;
  TERN_RETURN_IF_ERROR(
      WalkHead(prefix, /*prefix=*/true, out, records_at, &manifest_sum, &complete));
  return complete;
}

Result<NextRecordResult> NextRecord(std::span<const uint8_t> in, const ParsedPatch& head,
                                    RecordCursor* c, RecordView* rec) {
  while (c->tensor < head.tensors.size() && c->segment == head.tensors[c->tensor].segment_count) {
    ++c->tensor;
    c->segment = 0;
    c->next_free = 0;
  }
  if (c->tensor == head.tensors.size()) return NextRecordResult::kEnd;
  const ManifestTensor& mt = head.tensors[c->tensor];
  TERN_REQUIRE(c->at <= in.size(), kInvalidArgument, "record cursor past the bytes given");
  const uint64_t available = in.size() - c->at;
  if (available < sizeof(RecordHeader)) return NextRecordResult::kIncomplete;
  uint64_t need = 0;
  auto parsed = ParseRecord(in.data() + c->at, available, mt.code_bits, &need,
                            head.format_version >= kFormatVersion2 && mt.context.ok);
  if (!parsed.ok()) {
    if (need > available) return NextRecordResult::kIncomplete;
    return parsed.status().WithContext("tensor '" + mt.desc.name + "'");
  }
  const RecordHeader& h = parsed->h;
  TERN_REQUIRE(h.tensor_index == c->tensor, kCorrupt, "segment record out of order: tensor index ",
               h.tensor_index, " where ", c->tensor, " ('", mt.desc.name, "') was expected");
  TERN_REQUIRE(h.first_element >= c->next_free && h.element_count <= mt.code_elements &&
                   h.first_element <= mt.code_elements - h.element_count,
               kCorrupt, "tensor '", mt.desc.name, "': segment at element ", h.first_element,
               " overlaps or exceeds the tensor");
  if (mt.nibbles) {
    // Whole elements of the dtype, so that a record's changes are changes
    // of its own elements (and records never share one).
    const uint64_t per = mt.nibbles_per_element();
    TERN_REQUIRE(h.first_element % per == 0 && h.element_count % per == 0, kCorrupt, "tensor '",
                 mt.desc.name, "': nibble-coded segment not aligned to its ", DTypeName(mt.desc.dtype),
                 " elements");
  }
  if (mt.code_bits == 4)
    TERN_REQUIRE(h.first_element % 2 == 0 &&
                     (h.element_count % 2 == 0 || h.first_element + h.element_count == mt.code_elements),
                 kCorrupt, "tensor '", mt.desc.name, "': packed 4-bit segment not byte aligned");
  c->next_free = h.first_element + h.element_count;
  c->at += parsed->total_bytes;
  ++c->segment;
  *rec = *parsed;
  return NextRecordResult::kRecord;
}

std::vector<uint8_t> WritePatch(const std::vector<TensorDesc>& descs, uint64_t base_version,
                                uint64_t target_version, const ViewDigest& base_digest,
                                const ViewDigest& target_digest,
                                const std::vector<std::span<const uint8_t>>& records, uint16_t format_version,
                                const std::vector<bool>& nibbles) {
  TERN_ASSERT(nibbles.empty() || nibbles.size() == descs.size());
  bool any_nibbles = false;
  for (size_t t = 0; t < nibbles.size(); ++t)
    if (nibbles[t]) {
      TERN_ASSERT(format_version >= kFormatVersion2 && NibbleCodable(descs[t].dtype), "nibble coding of '",
                  descs[t].name, "' in a format-", format_version, " patch");
      any_nibbles = true;
    }
  std::vector<uint64_t> segments(descs.size(), 0);
  for (const auto& r : records) {
    RecordHeader h;
    std::memcpy(&h, r.data(), sizeof(h));
    TERN_ASSERT(h.tensor_index < descs.size());
    TERN_ASSERT(h.encoding != kContext || format_version >= kFormatVersion2, "CONTEXT record in a format-1 patch");
    segments[h.tensor_index]++;
  }
  std::vector<uint8_t> manifest;
  ManifestFixed m{};
  m.base_version = base_version;
  m.target_version = target_version;
  std::memcpy(m.base_digest, base_digest.Bytes().data(), 32);
  std::memcpy(m.target_digest, target_digest.Bytes().data(), 32);
  m.tensor_count = static_cast<uint32_t>(descs.size());
  manifest.resize(sizeof(m));
  std::memcpy(manifest.data(), &m, sizeof(m));
  for (size_t t = 0; t < descs.size(); ++t) {
    const TensorDesc& d = descs[t];
    PutFixed16(&manifest, static_cast<uint16_t>(d.name.size()));
    manifest.push_back(static_cast<uint8_t>(d.dtype));
    manifest.push_back(static_cast<uint8_t>(d.shape.size()));
    manifest.push_back(!nibbles.empty() && nibbles[t] ? kCodingNibbles : kCodingElements);
    manifest.push_back(0);
    manifest.push_back(0);
    manifest.push_back(0);
    manifest.insert(manifest.end(), d.name.begin(), d.name.end());
    for (uint64_t x : d.shape) PutFixed64(&manifest, x);
    PutFixed64(&manifest, d.elements());
    PutFixed64(&manifest, segments[t]);
  }
  uint64_t total = sizeof(FileHeader) + manifest.size() + kChecksumBytes + sizeof(Trailer);
  for (const auto& r : records) total += r.size();
  std::vector<uint8_t> out;
  out.reserve(total);
  FileHeader fh{};
  std::memcpy(fh.magic, kMagic, 8);
  TERN_ASSERT(format_version == kFormatVersion1 || format_version == kFormatVersion2);
  fh.version = any_nibbles ? kFormatVersion3 : format_version;
  fh.manifest_bytes = manifest.size();
  fh.checksum = XXH3_64bits(&fh, 24);
  out.resize(sizeof(fh));
  std::memcpy(out.data(), &fh, sizeof(fh));
  out.insert(out.end(), manifest.begin(), manifest.end());
  const uint64_t manifest_sum = XXH3_64bits(manifest.data(), manifest.size());
  PutFixed64(&out, manifest_sum);
  std::vector<uint64_t> sums;
  sums.reserve(records.size());
  for (const auto& r : records) {
    out.insert(out.end(), r.begin(), r.end());
    sums.push_back(DecodeFixed64(r.data() + r.size() - kChecksumBytes));
  }
  Trailer tr{};
  std::memcpy(tr.magic, kTrailerMagic, 8);
  tr.record_count = records.size();
  tr.checksum = TrailerChecksum(records.size(), manifest_sum, sums);
  const size_t at = out.size();
  out.resize(at + sizeof(tr));
  std::memcpy(out.data() + at, &tr, sizeof(tr));
  return out;
}

Status CheckLayout(const std::vector<ManifestTensor>& tensors, const std::vector<const TensorDesc*>& view) {
  for (size_t i = 0; i < tensors.size() || i < view.size(); ++i) {
    if (i >= view.size())
      return TERN_ERROR(kMismatch, "tensor '", tensors[i].desc.name, "' is in the patch but not in the view");
    if (i >= tensors.size())
      return TERN_ERROR(kMismatch, "tensor '", view[i]->name, "' is in the view but not in the patch");
    const TensorDesc& p = tensors[i].desc;
    const TensorDesc& v = *view[i];
    if (p.name != v.name) {
      const std::string& missing = p.name < v.name ? p.name : v.name;
      return TERN_ERROR(kMismatch, "tensor '", missing, "' is in ", p.name < v.name ? "the patch" : "the view",
                        " only");
    }
    TERN_REQUIRE(p.dtype == v.dtype, kMismatch, "tensor '", p.name, "': patch dtype ", DTypeName(p.dtype),
                 ", view dtype ", DTypeName(v.dtype));
    TERN_REQUIRE(p.shape == v.shape, kMismatch, "tensor '", p.name, "': shape differs from the patch");
  }
  return Status::Ok();
}

}  // namespace tern::patch
