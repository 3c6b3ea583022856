// tern_rank_publisher_*: a trainer rank in this process publishing its
// shards to a root's admin port (include/tern/tern.h, ABI 1.2;
// include/tern/rank_publish.h does the work, SendRankPart the sending).
// A mutex in the handle serializes its calls.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "capi/agent_handle.h"
#include "capi/client_handle.h"
#include "tern/agent.h"
#include "tern/rank_publish.h"

struct tern_rank_publisher {
  static constexpr uint32_t kTag = 0x7452616e;  // "tRan"
  uint32_t tag = kTag;
  std::mutex mu;
  std::unique_ptr<tern::RankPublisher> publisher;
  std::optional<tern::RankPart> pending;  // encoded, not sent yet
  std::vector<uint8_t> pending_bytes;
  uint32_t gather_timeout_ms = 0;
};

namespace tern::capi {

// Beside the other handles' CheckHandle overloads (a qualified call finds
// those in tern::capi and would not look into an anonymous namespace).
static Status CheckHandle(const tern_rank_publisher* p) {
  TERN_REQUIRE(p != nullptr, kInvalidArgument, "publisher is NULL");
  TERN_REQUIRE(p->tag == tern_rank_publisher::kTag, kInvalidArgument,
               "publisher is not a tern_rank_publisher (another handle, or one already freed)");
  return Status::Ok();
}

namespace {

constexpr size_t kShardBytesV1 = offsetof(tern_shard, bytes) + sizeof(uint64_t);
constexpr size_t kRankOptionsBytesV1 =
    offsetof(tern_rank_publisher_options, gather_timeout_ms) + sizeof(uint32_t);
constexpr size_t kMaxShards = size_t{1} << 20;

// The caller's tern_shard array (stride shards[0].struct_size); with
// `data` the bytes are borrowed, else ignored.
Status ReadShards(const tern_shard* shards, size_t count, bool data, std::vector<RankShard>* out) {
  TERN_REQUIRE(shards != nullptr, kInvalidArgument, "shards is NULL");
  TERN_REQUIRE(count >= 1 && count <= kMaxShards, kInvalidArgument, "shard count ", count,
               ": want 1..", kMaxShards);
  size_t stride = 0;
  std::memcpy(&stride, shards, sizeof stride);
  for (size_t i = 0; i < count; ++i) {
    const auto* at = reinterpret_cast<const unsigned char*>(shards) + i * stride;
    size_t size = 0;
    std::memcpy(&size, at, sizeof size);
    TERN_REQUIRE(size == stride, kInvalidArgument, "shards[", i, "].struct_size is ", size,
                 ", shards[0]'s is ", stride, ": one array has one element size");
    tern_shard c;
    tern_shard_init(&c);
    const std::string what = "shards[" + std::to_string(i) + "]";
    TERN_RETURN_IF_ERROR(ReadVersionedStruct(at, &c, sizeof c, kShardBytesV1, what.c_str()));
    TERN_REQUIRE(c.tensor != nullptr, kInvalidArgument, what, ".tensor is NULL");
    RankShard s;
    TERN_ASSIGN_OR_RETURN(s.range.tensor, ReadString(c.tensor, (what + ".tensor").c_str()));
    s.range.first_element = c.first_element;
    s.range.element_count = c.element_count;
    if (data) {
      s.data = c.data;
      s.bytes = c.bytes;
    }
    out->push_back(std::move(s));
  }
  return Status::Ok();
}

Status Create(const tern_rank_publisher_options* options, tern_rank_publisher** out) {
  TERN_REQUIRE(out != nullptr, kInvalidArgument, "out is NULL");
  *out = nullptr;
  TERN_REQUIRE(options != nullptr, kInvalidArgument, "options is NULL");
  tern_rank_publisher_options c;
  tern_rank_publisher_options_init(&c);
  TERN_RETURN_IF_ERROR(ReadVersionedStruct(options, &c, sizeof c, kRankOptionsBytesV1,
                                           "tern_rank_publisher_options"));
  TERN_REQUIRE(c.layout != nullptr, kInvalidArgument, "layout is NULL");
  TERN_REQUIRE(c.layout_count >= 1 && c.layout_count <= kMaxPublishTensors, kInvalidArgument,
               "layout_count ", c.layout_count, ": want 1..", kMaxPublishTensors);
  TERN_REQUIRE(c.gather_timeout_ms >= 1 && c.gather_timeout_ms <= 600000, kInvalidArgument,
               "gather_timeout_ms ", c.gather_timeout_ms, ": want 1..600000");
  TERN_ASSIGN_OR_RETURN(std::vector<PublishTensor> tensors, ReadTensors(c.layout, c.layout_count));
  std::vector<TensorDesc> layout;
  for (PublishTensor& t : tensors) layout.push_back({std::move(t.name), t.dtype, std::move(t.shape)});
  std::sort(layout.begin(), layout.end(),
            [](const TensorDesc& a, const TensorDesc& b) { return a.name < b.name; });
  std::vector<RankShard> shards;
  TERN_RETURN_IF_ERROR(ReadShards(c.shards, c.shard_count, false, &shards));
  std::vector<RankShardRange> ranges;
  for (RankShard& s : shards) ranges.push_back(std::move(s.range));
  RankPublisherOptions o;
  o.segment_elements = c.segment_elements;
  TERN_ASSIGN_OR_RETURN(auto publisher, RankPublisher::Create(c.rank, c.world_size, std::move(layout),
                                                              std::move(ranges), o));
  auto handle = std::make_unique<tern_rank_publisher>();
  handle->publisher = std::move(publisher);
  handle->gather_timeout_ms = c.gather_timeout_ms;
  *out = handle.release();
  return Status::Ok();
}

// Encodes `version` from `now` on a publisher that holds its base, sends it
// as a resume and takes the outcome as send does (p->mu held).
tern::Status EncodeAndResume(tern_rank_publisher* p, tern_client* client, uint64_t version,
                             const std::vector<tern::RankShard>& now, uint64_t* part_bytes) {
  TERN_ASSIGN_OR_RETURN(tern::RankPart part, p->publisher->Encode(version, now));
  TERN_ASSIGN_OR_RETURN(p->pending_bytes, tern::EncodeRankPart(part));
  if (part_bytes != nullptr) *part_bytes = p->pending_bytes.size();
  part.records.clear();
  p->pending = std::move(part);
  const tern::Status s =
      tern::ResumeRankPart(client->address, p->pending_bytes, version, p->pending->rank,
                           p->gather_timeout_ms, client->options);
  // As send: a timeout keeps the part (send asks again); otherwise the
  // outcome is final and the previous view is base's unless it committed.
  if (s.code() == tern::Code::kTimeout) return s;
  const tern::Status after = s.ok() ? p->publisher->Committed() : (p->publisher->Abandon(), s);
  p->pending.reset();
  p->pending_bytes.clear();
  return after;
}

tern::Status MustBeNew(tern_rank_publisher* p, const char* call) {
  TERN_REQUIRE(p->publisher->version() == 0, kMismatch, call, " is for a new publisher (one ",
               "that has committed nothing); this one holds version ", p->publisher->version(),
               ": encode and send as usual");
  return tern::Status::Ok();
}

}  // namespace
}  // namespace tern::capi

using tern::capi::Guard;

extern "C" {

void tern_shard_init(tern_shard* shard) {
  if (shard == nullptr) return;
  std::memset(shard, 0, sizeof *shard);
  shard->struct_size = sizeof *shard;
}

void tern_rank_publisher_options_init(tern_rank_publisher_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->world_size = 1;
  options->segment_elements = tern::RankPublisherOptions{}.segment_elements;
  options->gather_timeout_ms = 60000;
}

tern_code tern_rank_publisher_create(const tern_rank_publisher_options* options,
                                     tern_rank_publisher** out) {
  return Guard([&] { return tern::capi::Create(options, out); });
}

tern_code tern_rank_publisher_encode(tern_rank_publisher* p, uint64_t version,
                                     const tern_shard* shards, size_t count, uint64_t* part_bytes) {
  return Guard([&]() -> tern::Status {
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(p));
    std::vector<tern::RankShard> given;
    TERN_RETURN_IF_ERROR(tern::capi::ReadShards(shards, count, true, &given));
    std::lock_guard lock(p->mu);
    p->pending.reset();
    p->pending_bytes.clear();
    TERN_ASSIGN_OR_RETURN(tern::RankPart part, p->publisher->Encode(version, given));
    TERN_ASSIGN_OR_RETURN(p->pending_bytes, tern::EncodeRankPart(part));
    if (part_bytes != nullptr) *part_bytes = p->pending_bytes.size();
    part.records.clear();  // the bytes hold them; only the version and rank are read again
    p->pending = std::move(part);
    return tern::Status::Ok();
  });
}

tern_code tern_rank_publisher_send(tern_rank_publisher* p, tern_client* client) {
  return Guard([&]() -> tern::Status {
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(p));
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(client));
    std::lock_guard lock(p->mu);
    TERN_REQUIRE(p->pending.has_value(), kInvalidArgument,
                 "nothing to send: call tern_rank_publisher_encode first");
    const tern::Status s = tern::SendRankPart(client->address, p->pending_bytes, p->pending->version,
                                              p->pending->rank, p->gather_timeout_ms, client->options);
    // A timeout says nothing of the outcome: the part stays, and sending it
    // again asks the root (which answers a committed part's outcome).
    if (s.code() == tern::Code::kTimeout) return s;
    // Committed fails only if the publisher's own records cannot be applied
    // (the version is on the board; this publisher must be resumed anew).
    const tern::Status after = s.ok() ? p->publisher->Committed() : (p->publisher->Abandon(), s);
    p->pending.reset();
    p->pending_bytes.clear();
    return after;
  });
}

tern_code tern_rank_publisher_resume(tern_rank_publisher* p, tern_client* client,
                                     uint64_t base_version, const tern_shard* base,
                                     size_t base_count, uint64_t version, const tern_shard* shards,
                                     size_t count, uint64_t* part_bytes) {
  return Guard([&]() -> tern::Status {
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(p));
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(client));
    std::vector<tern::RankShard> before, now;
    // An empty board's version starts at the zero view a new publisher holds.
    const bool zero_base = base_version == 0 && base_count == 0;
    if (!zero_base) TERN_RETURN_IF_ERROR(tern::capi::ReadShards(base, base_count, true, &before));
    TERN_RETURN_IF_ERROR(tern::capi::ReadShards(shards, count, true, &now));
    std::lock_guard lock(p->mu);
    TERN_RETURN_IF_ERROR(tern::capi::MustBeNew(p, "resume"));
    p->pending.reset();
    p->pending_bytes.clear();
    if (!zero_base) TERN_RETURN_IF_ERROR(p->publisher->Resume(base_version, before));
    return tern::capi::EncodeAndResume(p, client, version, now, part_bytes);
  });
}

tern_code tern_rank_publisher_rebase(tern_rank_publisher* p, tern_client* client,
                                     uint64_t* base_version) {
  return Guard([&]() -> tern::Status {
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(p));
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(client));
    std::lock_guard lock(p->mu);
    TERN_RETURN_IF_ERROR(tern::capi::MustBeNew(p, "rebase"));
    p->pending.reset();
    p->pending_bytes.clear();
    TERN_ASSIGN_OR_RETURN(uint64_t head,
                          tern::FetchRankBase(client->address, *p->publisher, client->options));
    if (base_version != nullptr) *base_version = head;
    return tern::Status::Ok();
  });
}

tern_code tern_rank_publisher_resume_from_root(tern_rank_publisher* p, tern_client* client,
                                               uint64_t version, const tern_shard* shards,
                                               size_t count, uint64_t* part_bytes) {
  return Guard([&]() -> tern::Status {
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(p));
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(client));
    std::vector<tern::RankShard> now;
    TERN_RETURN_IF_ERROR(tern::capi::ReadShards(shards, count, true, &now));
    std::lock_guard lock(p->mu);
    TERN_RETURN_IF_ERROR(tern::capi::MustBeNew(p, "resume"));
    p->pending.reset();
    p->pending_bytes.clear();
    TERN_RETURN_IF_ERROR(
        tern::FetchRankBase(client->address, *p->publisher, client->options).status());
    return tern::capi::EncodeAndResume(p, client, version, now, part_bytes);
  });
}

uint64_t tern_rank_publisher_version(tern_rank_publisher* p) {
  if (!tern::capi::CheckHandle(p).ok()) return 0;
  std::lock_guard lock(p->mu);
  return p->publisher->version();
}

void tern_rank_publisher_free(tern_rank_publisher* p) {
  if (p == nullptr || p->tag != tern_rank_publisher::kTag) return;
  p->tag = 0;
  delete p;
}

}  // extern "C"
