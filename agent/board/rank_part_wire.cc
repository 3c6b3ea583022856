// EncodeRankPart and DecodeRankPart (include/tern/rank_publish.h): the
// wire form of a trainer rank's part, docs/format/agent.md §11. One rule
// set (CheckPart) serves both directions, so the encoder cannot write what
// the decoder refuses.
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "base/coding.h"
#include "tern/rank_publish.h"

namespace tern {
namespace {

constexpr char kMagic[8] = {'T', 'E', 'R', 'N', 'R', 'P', 'R', 'T'};
constexpr uint16_t kFormat = 1;
constexpr size_t kHeaderBytes = 120;
constexpr size_t kTensorFixedBytes = 8;
constexpr size_t kShardBytes = 24;
constexpr size_t kRecordFixedBytes = 56;
constexpr uint32_t kMaxWorldSize = 65536;
constexpr uint64_t kMaxTensors = uint64_t{1} << 20;
constexpr uint64_t kMaxShards = uint64_t{1} << 20;
constexpr uint64_t kMaxRecords = uint64_t{1} << 24;
constexpr size_t kMaxNameBytes = 1024;
constexpr size_t kMaxNdim = 8;
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxSegmentElements = (uint64_t{1} << 24) - 1;

std::string Range(uint64_t first, uint64_t count) {
  return "[" + std::to_string(first) + ", " + std::to_string(first) + " + " + std::to_string(count) +
         ")";
}

// Element ranges of one list: inside their tensor, strictly ascending by
// (tensor, first), not overlapping. `what` names the list in errors.
template <class Entry, class TensorOf>
Status CheckRanges(const std::vector<Entry>& list, const std::vector<uint64_t>& elements,
                   TensorOf tensor_of, const char* what, uint64_t max_count) {
  for (size_t i = 0; i < list.size(); ++i) {
    const Entry& e = list[i];
    const uint64_t t = tensor_of(e);
    TERN_REQUIRE(t < elements.size(), kCorrupt, "rank part: ", what, " ", i, ": tensor ", t,
                 " of ", elements.size());
    const uint64_t n = elements[t];
    TERN_REQUIRE(e.element_count >= 1 && e.element_count <= max_count && e.element_count <= n &&
                     e.first_element <= n - e.element_count,
                 kCorrupt, "rank part: ", what, " ", i, ": elements ",
                 Range(e.first_element, e.element_count), " of tensor ", t, " (", n,
                 " elements; at most ", max_count, " in one)");
    if (i > 0) {
      const Entry& p = list[i - 1];
      const uint64_t pt = tensor_of(p);
      TERN_REQUIRE(pt < t || (pt == t && p.first_element + p.element_count <= e.first_element),
                   kCorrupt, "rank part: ", what, " ", i, " (tensor ", t, ", elements ",
                   Range(e.first_element, e.element_count), ") is not after the one before it");
    }
  }
  return Status::Ok();
}

// Everything §11 says of a part, on the struct; kCorrupt.
Status CheckPart(const RankPart& p, std::vector<uint32_t>* shard_tensors) {
  TERN_REQUIRE(p.format_version == 1 || p.format_version == 2, kCorrupt,
               "rank part: patch format ", p.format_version, ": want 1 or 2");
  TERN_REQUIRE(p.world_size >= 1 && p.world_size <= kMaxWorldSize && p.rank < p.world_size,
               kCorrupt, "rank part: rank ", p.rank, " of world size ", p.world_size,
               ": want rank < world size <= ", kMaxWorldSize);
  TERN_REQUIRE(p.version > p.base_version, kCorrupt, "rank part: version ", p.version,
               " is not above its base version ", p.base_version);
  TERN_REQUIRE(!p.layout.empty() && p.layout.size() <= kMaxTensors, kCorrupt, "rank part: ",
               p.layout.size(), " tensors: want 1..", kMaxTensors);
  TERN_REQUIRE(!p.shards.empty() && p.shards.size() <= kMaxShards, kCorrupt, "rank part: ",
               p.shards.size(), " shards: want 1..", kMaxShards);
  TERN_REQUIRE(p.records.size() <= kMaxRecords, kCorrupt, "rank part: ", p.records.size(),
               " records: at most ", kMaxRecords);
  std::vector<uint64_t> elements;
  elements.reserve(p.layout.size());
  for (size_t i = 0; i < p.layout.size(); ++i) {
    const TensorDesc& d = p.layout[i];
    TERN_REQUIRE(!d.name.empty() && d.name.size() <= kMaxNameBytes, kCorrupt, "rank part: tensor ",
                 i, ": name of ", d.name.size(), " bytes: want 1..", kMaxNameBytes);
    TERN_REQUIRE(DTypeValid(static_cast<uint8_t>(d.dtype)), kCorrupt, "rank part: tensor ",
                 d.name.substr(0, 200), ": dtype code ", static_cast<unsigned>(d.dtype));
    TERN_REQUIRE(d.shape.size() <= kMaxNdim, kCorrupt, "rank part: tensor ", d.name.substr(0, 200),
                 ": ", d.shape.size(), " dimensions: at most ", kMaxNdim);
    auto n = CheckedElements(d.dtype, d.shape);
    TERN_REQUIRE(n.ok(), kCorrupt, "rank part: tensor ", d.name.substr(0, 200), ": ",
                 n.status().message());
    TERN_REQUIRE(i == 0 || p.layout[i - 1].name < d.name, kCorrupt, "rank part: tensor ",
                 d.name.substr(0, 200), " is not after ", p.layout[i - 1].name.substr(0, 200),
                 " (names strictly ascending)");
    elements.push_back(*n);
  }
  // Shards name their tensor; index them (the layout is sorted: binary search).
  shard_tensors->clear();
  shard_tensors->reserve(p.shards.size());
  for (size_t i = 0; i < p.shards.size(); ++i) {
    const std::string& name = p.shards[i].tensor;
    size_t lo = 0, hi = p.layout.size();
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (p.layout[mid].name < name) lo = mid + 1;
      else hi = mid;
    }
    TERN_REQUIRE(lo < p.layout.size() && p.layout[lo].name == name, kCorrupt, "rank part: shard ",
                 i, ": tensor ", name.substr(0, 200), " is not in the layout");
    shard_tensors->push_back(static_cast<uint32_t>(lo));
  }
  TERN_RETURN_IF_ERROR(CheckRanges(
      p.shards, elements, [&](const RankShardRange& r) { return (*shard_tensors)[&r - p.shards.data()]; },
      "shard", UINT64_MAX));
  for (size_t i = 0; i < p.shards.size(); ++i) {
    const RankShardRange& r = p.shards[i];
    const TensorDesc& d = p.layout[(*shard_tensors)[i]];
    if (ElementBits(d.dtype) == 4)
      TERN_REQUIRE(r.first_element % 2 == 0 &&
                       (r.element_count % 2 == 0 || r.first_element + r.element_count == elements[(*shard_tensors)[i]]),
                   kCorrupt, "rank part: shard ", i, " of 4-bit ", d.name.substr(0, 200),
                   " is not byte-aligned");
  }
  TERN_RETURN_IF_ERROR(CheckRanges(
      p.records, elements, [](const SegmentRecord& r) { return uint64_t{r.tensor_index}; }, "record",
      kMaxSegmentElements));
  for (size_t i = 0; i < p.records.size(); ++i)
    TERN_REQUIRE(!p.records[i].bytes.empty() && p.records[i].bytes.size() <= kMaxRecordBytes,
                 kCorrupt, "rank part: record ", i, ": ", p.records[i].bytes.size(),
                 " bytes: want 1..", kMaxRecordBytes);
  return Status::Ok();
}

void PutDigest(std::vector<uint8_t>* out, const ViewDigest& d) {
  const auto b = d.Bytes();
  out->insert(out->end(), b.begin(), b.end());
}

// Reads from the front of *in: kCorrupt naming `what` when too short.
Status Take(std::string_view* in, size_t n, const char* what, std::string_view* out) {
  TERN_REQUIRE(in->size() >= n, kCorrupt, "rank part: truncated in ", what, " (", n,
               " bytes wanted, ", in->size(), " left)");
  *out = in->substr(0, n);
  in->remove_prefix(n);
  return Status::Ok();
}

const uint8_t* U8(std::string_view s) { return reinterpret_cast<const uint8_t*>(s.data()); }

}  // namespace

Result<std::vector<uint8_t>> EncodeRankPart(const RankPart& part) {
  std::vector<uint32_t> shard_tensors;
  Status s = CheckPart(part, &shard_tensors);
  if (!s.ok()) return Status(Code::kInvalidArgument, s.message());
  uint64_t total = kHeaderBytes + kShardBytes * part.shards.size();
  for (const TensorDesc& d : part.layout) total += kTensorFixedBytes + 8 * d.shape.size() + d.name.size();
  for (const SegmentRecord& r : part.records) total += kRecordFixedBytes + r.bytes.size();
  TERN_REQUIRE(total <= kMaxRankPartBytes, kInvalidArgument, "rank part: ", total,
               " bytes, over the format's ", kMaxRankPartBytes);
  std::vector<uint8_t> out;
  out.reserve(total);
  out.insert(out.end(), kMagic, kMagic + 8);
  PutFixed16(&out, kFormat);
  PutFixed16(&out, part.format_version);
  PutFixed32(&out, part.rank);
  PutFixed32(&out, part.world_size);
  PutFixed32(&out, static_cast<uint32_t>(part.layout.size()));
  PutFixed32(&out, static_cast<uint32_t>(part.shards.size()));
  PutFixed32(&out, static_cast<uint32_t>(part.records.size()));
  PutFixed64(&out, part.base_version);
  PutFixed64(&out, part.version);
  PutDigest(&out, part.base_terms);
  PutDigest(&out, part.target_terms);
  PutFixed64(&out, 0);
  for (const TensorDesc& d : part.layout) {
    PutFixed16(&out, static_cast<uint16_t>(d.name.size()));
    PutFixed(&out, static_cast<uint8_t>(d.dtype), 1);
    PutFixed(&out, d.shape.size(), 1);
    PutFixed32(&out, 0);
    for (uint64_t dim : d.shape) PutFixed64(&out, dim);
    out.insert(out.end(), d.name.begin(), d.name.end());
  }
  for (size_t i = 0; i < part.shards.size(); ++i) {
    PutFixed32(&out, shard_tensors[i]);
    PutFixed32(&out, 0);
    PutFixed64(&out, part.shards[i].first_element);
    PutFixed64(&out, part.shards[i].element_count);
  }
  for (const SegmentRecord& r : part.records) {
    PutFixed32(&out, r.tensor_index);
    PutFixed32(&out, static_cast<uint32_t>(r.bytes.size()));
    PutFixed64(&out, r.first_element);
    PutFixed64(&out, r.element_count);
    PutDigest(&out, r.digest_delta);
    out.insert(out.end(), r.bytes.begin(), r.bytes.end());
  }
  TERN_ASSERT(out.size() == total);
  return out;
}

Result<RankPart> DecodeRankPart(std::span<const uint8_t> bytes) {
  TERN_REQUIRE(bytes.size() <= kMaxRankPartBytes, kCorrupt, "rank part: ", bytes.size(),
               " bytes, over the format's ", kMaxRankPartBytes);
  std::string_view in(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::string_view h;
  TERN_RETURN_IF_ERROR(Take(&in, kHeaderBytes, "the header", &h));
  TERN_REQUIRE(h.substr(0, 8) == std::string_view(kMagic, 8), kCorrupt,
               "rank part: bad magic (want TERNRPRT)");
  const uint16_t format = static_cast<uint16_t>(DecodeFixedAt(h, 8, 2));
  TERN_REQUIRE(format == kFormat, kCorrupt, "rank part: format ", format, " (this reader knows ",
               kFormat, ")");
  TERN_REQUIRE(DecodeFixedAt(h, 112, 8) == 0, kCorrupt, "rank part: reserved header bytes 112..119 not zero");
  RankPart p;
  p.format_version = static_cast<uint16_t>(DecodeFixedAt(h, 10, 2));
  p.rank = static_cast<uint32_t>(DecodeFixedAt(h, 12, 4));
  p.world_size = static_cast<uint32_t>(DecodeFixedAt(h, 16, 4));
  const uint64_t tensor_count = DecodeFixedAt(h, 20, 4);
  const uint64_t shard_count = DecodeFixedAt(h, 24, 4);
  const uint64_t record_count = DecodeFixedAt(h, 28, 4);
  p.base_version = DecodeFixedAt(h, 32, 8);
  p.version = DecodeFixedAt(h, 40, 8);
  p.base_terms = ViewDigest::FromBytes(U8(h.substr(48, 32)));
  p.target_terms = ViewDigest::FromBytes(U8(h.substr(80, 32)));
  // Counts against their bounds and against the bytes left before any
  // allocation: a short input cannot make the decoder reserve much.
  TERN_REQUIRE(tensor_count >= 1 && tensor_count <= kMaxTensors &&
                   tensor_count <= in.size() / (kTensorFixedBytes + 1),
               kCorrupt, "rank part: tensor_count ", tensor_count, " (want 1..", kMaxTensors,
               " and what the bytes hold)");
  TERN_REQUIRE(shard_count >= 1 && shard_count <= kMaxShards && shard_count <= in.size() / kShardBytes,
               kCorrupt, "rank part: shard_count ", shard_count, " (want 1..", kMaxShards,
               " and what the bytes hold)");
  TERN_REQUIRE(record_count <= kMaxRecords && record_count <= in.size() / (kRecordFixedBytes + 1),
               kCorrupt, "rank part: record_count ", record_count, " (want at most ", kMaxRecords,
               " and what the bytes hold)");
  p.layout.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    std::string_view t;
    TERN_RETURN_IF_ERROR(Take(&in, kTensorFixedBytes, "a tensor", &t));
    const size_t name_bytes = DecodeFixedAt(t, 0, 2);
    const uint8_t dtype = static_cast<uint8_t>(DecodeFixedAt(t, 2, 1));
    const size_t ndim = DecodeFixedAt(t, 3, 1);
    TERN_REQUIRE(DecodeFixedAt(t, 4, 4) == 0, kCorrupt, "rank part: tensor ", i,
                 ": reserved bytes not zero");
    TERN_REQUIRE(DTypeValid(dtype), kCorrupt, "rank part: tensor ", i, ": dtype code ",
                 unsigned{dtype});
    TERN_REQUIRE(ndim <= kMaxNdim, kCorrupt, "rank part: tensor ", i, ": ", ndim,
                 " dimensions: at most ", kMaxNdim);
    TERN_REQUIRE(name_bytes >= 1 && name_bytes <= kMaxNameBytes, kCorrupt, "rank part: tensor ", i,
                 ": name of ", name_bytes, " bytes: want 1..", kMaxNameBytes);
    std::string_view rest;
    TERN_RETURN_IF_ERROR(Take(&in, 8 * ndim + name_bytes, "a tensor's shape and name", &rest));
    TensorDesc d;
    d.dtype = static_cast<DType>(dtype);
    for (size_t k = 0; k < ndim; ++k) d.shape.push_back(DecodeFixedAt(rest, 8 * k, 8));
    d.name.assign(rest.substr(8 * ndim));
    p.layout.push_back(std::move(d));
  }
  p.shards.reserve(shard_count);
  for (uint64_t i = 0; i < shard_count; ++i) {
    std::string_view s;
    TERN_RETURN_IF_ERROR(Take(&in, kShardBytes, "a shard", &s));
    const uint64_t t = DecodeFixedAt(s, 0, 4);
    TERN_REQUIRE(t < tensor_count, kCorrupt, "rank part: shard ", i, ": tensor ", t, " of ",
                 tensor_count);
    TERN_REQUIRE(DecodeFixedAt(s, 4, 4) == 0, kCorrupt, "rank part: shard ", i,
                 ": reserved bytes not zero");
    p.shards.push_back({p.layout[t].name, DecodeFixedAt(s, 8, 8), DecodeFixedAt(s, 16, 8)});
  }
  p.records.reserve(record_count);
  for (uint64_t i = 0; i < record_count; ++i) {
    std::string_view r;
    TERN_RETURN_IF_ERROR(Take(&in, kRecordFixedBytes, "a record", &r));
    SegmentRecord rec;
    rec.tensor_index = static_cast<uint32_t>(DecodeFixedAt(r, 0, 4));
    const uint64_t n = DecodeFixedAt(r, 4, 4);
    rec.first_element = DecodeFixedAt(r, 8, 8);
    rec.element_count = DecodeFixedAt(r, 16, 8);
    rec.digest_delta = ViewDigest::FromBytes(U8(r.substr(24, 32)));
    TERN_REQUIRE(n >= 1 && n <= kMaxRecordBytes, kCorrupt, "rank part: record ", i, ": ", n,
                 " bytes: want 1..", kMaxRecordBytes);
    std::string_view body;
    TERN_RETURN_IF_ERROR(Take(&in, n, "a record's bytes", &body));
    rec.bytes.assign(U8(body), U8(body) + body.size());
    p.records.push_back(std::move(rec));
  }
  TERN_REQUIRE(in.empty(), kCorrupt, "rank part: ", in.size(), " trailing bytes");
  std::vector<uint32_t> shard_tensors;
  TERN_RETURN_IF_ERROR(CheckPart(p, &shard_tensors));
  return p;
}

}  // namespace tern
