// RankPublisher and AssembleRankParts (include/tern/rank_publish.h).
#include "tern/rank_publish.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "agent/board/rank_publish_testing.h"
#include "tern/thread_pool.h"

namespace tern {
namespace {

constexpr uint64_t kMaxSegment = (uint64_t{1} << 24) - 1;

uint64_t ByteOffset(DType dtype, uint64_t element) {
  return element * static_cast<uint64_t>(ElementBits(dtype)) / 8;
}

std::string RangeText(uint64_t first, uint64_t count) {
  return "[" + std::to_string(first) + ", " + std::to_string(first + count) + ")";
}

// A pointer that EncodeSegment may index by the tensor's element numbers
// while only [first, first + count) is read: the shard's bytes, shifted
// back by the range's byte offset. Integer arithmetic, as the bytes before
// the shard are never dereferenced.
const uint8_t* AsTensorBase(const uint8_t* shard, DType dtype, uint64_t first) {
  return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(shard) -
                                          static_cast<uintptr_t>(ByteOffset(dtype, first)));
}

// The element hashes of zeros over [first, first + count) of a tensor.
ViewDigest ZeroTerms(const TensorDesc& desc, uint64_t first, uint64_t count) {
  const uint64_t seed = TensorSeed(desc);
  ViewDigest d;
  for (uint64_t i = 0; i < count; ++i) d += ElementHash(seed, first + i, 0);
  return d;
}

// Checks one set of ranges against the layout (sorted by name): known
// tensors, in bounds, byte-aligned for 4-bit dtypes. `who` prefixes errors.
Status CheckRange(const std::vector<TensorDesc>& layout, const std::map<std::string, uint32_t>& index,
                  const RankShardRange& r, const std::string& who, uint32_t* tensor_index) {
  auto it = index.find(r.tensor);
  TERN_REQUIRE(it != index.end(), kInvalidArgument, who, ": tensor ", r.tensor.substr(0, 200),
               " is not in the layout");
  const TensorDesc& d = layout[it->second];
  const uint64_t n = d.elements();
  TERN_REQUIRE(r.element_count >= 1 && r.element_count <= n && r.first_element <= n - r.element_count,
               kInvalidArgument, who, ": shard ", RangeText(r.first_element, r.element_count), " of ",
               r.tensor, " is outside its ", n, " elements");
  if (ElementBits(d.dtype) == 4)
    TERN_REQUIRE(r.first_element % 2 == 0 &&
                     (r.element_count % 2 == 0 || r.first_element + r.element_count == n),
                 kInvalidArgument, who, ": shard ", RangeText(r.first_element, r.element_count),
                 " of 4-bit ", r.tensor, " is not byte-aligned");
  *tensor_index = it->second;
  return Status::Ok();
}

std::map<std::string, uint32_t> IndexOf(const std::vector<TensorDesc>& layout) {
  std::map<std::string, uint32_t> index;
  for (uint32_t i = 0; i < layout.size(); ++i) index[layout[i].name] = i;
  return index;
}

Status CheckLayout(const std::vector<TensorDesc>& layout) {
  TERN_REQUIRE(!layout.empty(), kInvalidArgument, "rank publish: an empty layout");
  for (size_t i = 0; i < layout.size(); ++i) {
    TERN_RETURN_IF_ERROR(CheckedElements(layout[i].dtype, layout[i].shape).status());
    TERN_REQUIRE(i == 0 || layout[i - 1].name < layout[i].name, kInvalidArgument,
                 "rank publish: the layout is not sorted by name without duplicates at ",
                 layout[i].name.substr(0, 200));
  }
  return Status::Ok();
}

}  // namespace

struct RankPublisher::State {
  uint32_t rank = 0, world_size = 0;
  RankPublisherOptions options;
  std::vector<TensorDesc> layout;
  struct Shard {
    RankShardRange range;
    uint32_t tensor = 0;
    std::vector<uint8_t> prev;
    // The pending part's records of this shard: [first, end) of
    // pending_records.
    size_t first_record = 0, end_record = 0;
  };
  std::vector<Shard> shards;
  uint64_t version = 0, pending_version = 0;
  bool has_pending = false;
  // Set when a commit could not advance the previous view (some shards may
  // have advanced, others not): every call is refused with it, Resume
  // too; a new publisher is resumed instead.
  Status broken = Status::Ok();
  ViewDigest terms, pending_terms;
  // The pending part's records, applied to prev on Committed(): the
  // changes only (~the part's bytes), not a copy of the new shards.
  std::vector<SegmentRecord> pending_records;
  std::unique_ptr<ThreadPool> pool;  // Apply's, one thread, made at the first commit
};

namespace {
// The given shards in the owned order, each checked against the range it
// names: exactly the owned ranges, once each, with the range's byte count.
Result<std::vector<const RankShard*>> InOwnedOrder(const RankPublisher::State& st,
                                                   const std::vector<RankShard>& shards) {
  const std::string who = "rank " + std::to_string(st.rank);
  TERN_REQUIRE(shards.size() == st.shards.size(), kInvalidArgument, who, ": ", shards.size(),
               " shards given, it owns ", st.shards.size());
  std::vector<const RankShard*> given(st.shards.size(), nullptr);
  for (const RankShard& g : shards) {
    size_t k = 0;
    while (k < st.shards.size() &&
           !(st.shards[k].range.tensor == g.range.tensor &&
             st.shards[k].range.first_element == g.range.first_element &&
             st.shards[k].range.element_count == g.range.element_count))
      ++k;
    TERN_REQUIRE(k < st.shards.size(), kInvalidArgument, who, ": shard ",
                 RangeText(g.range.first_element, g.range.element_count), " of ",
                 g.range.tensor.substr(0, 200), " is not one it owns");
    TERN_REQUIRE(given[k] == nullptr, kInvalidArgument, who, ": shard ",
                 RangeText(g.range.first_element, g.range.element_count), " of ", g.range.tensor,
                 " given twice");
    TERN_REQUIRE(g.data != nullptr && g.bytes == st.shards[k].prev.size(), kInvalidArgument, who,
                 ": shard ", RangeText(g.range.first_element, g.range.element_count), " of ",
                 g.range.tensor, " has ", g.bytes, " bytes at ", g.data, ", want ",
                 st.shards[k].prev.size(), " bytes");
    given[k] = &g;
  }
  return given;
}
}  // namespace

RankPublisher::RankPublisher(std::unique_ptr<State> state) : state_(std::move(state)) {}
RankPublisher::~RankPublisher() = default;

Result<std::unique_ptr<RankPublisher>> RankPublisher::Create(uint32_t rank, uint32_t world_size,
                                                             std::vector<TensorDesc> layout,
                                                             std::vector<RankShardRange> shards,
                                                             const RankPublisherOptions& options) {
  TERN_REQUIRE(world_size >= 1 && rank < world_size, kInvalidArgument, "rank publish: rank ", rank,
               " is not below the world size ", world_size);
  TERN_REQUIRE(options.segment_elements >= 1 && options.segment_elements < kMaxSegment,
               kInvalidArgument, "rank publish: segment_elements must be in [1, 2^24)");
  TERN_REQUIRE(options.format_version == 1 || options.format_version == 2, kInvalidArgument,
               "rank publish: format_version ", options.format_version, ": want 1 or 2");
  TERN_RETURN_IF_ERROR(CheckLayout(layout));
  auto st = std::make_unique<State>();
  st->rank = rank;
  st->world_size = world_size;
  st->options = options;
  st->layout = std::move(layout);
  const auto index = IndexOf(st->layout);
  const std::string who = "rank " + std::to_string(rank);
  for (RankShardRange& r : shards) {
    State::Shard s;
    TERN_RETURN_IF_ERROR(CheckRange(st->layout, index, r, who, &s.tensor));
    s.range = std::move(r);
    st->shards.push_back(std::move(s));
  }
  TERN_REQUIRE(!st->shards.empty(), kInvalidArgument, who, " owns no shard");
  std::sort(st->shards.begin(), st->shards.end(), [](const State::Shard& a, const State::Shard& b) {
    return std::tie(a.tensor, a.range.first_element) < std::tie(b.tensor, b.range.first_element);
  });
  for (size_t i = 1; i < st->shards.size(); ++i) {
    const auto& a = st->shards[i - 1].range;
    const auto& b = st->shards[i].range;
    TERN_REQUIRE(a.tensor != b.tensor || a.first_element + a.element_count <= b.first_element,
                 kInvalidArgument, who, ": its shards ", RangeText(a.first_element, a.element_count),
                 " and ", RangeText(b.first_element, b.element_count), " of ", a.tensor, " overlap");
  }
  for (State::Shard& s : st->shards) {
    const TensorDesc& d = st->layout[s.tensor];
    s.prev.assign(DTypeBytes(d.dtype, s.range.element_count), 0);
    st->terms += ZeroTerms(d, s.range.first_element, s.range.element_count);
  }
  return std::unique_ptr<RankPublisher>(new RankPublisher(std::move(st)));
}

Result<RankPart> RankPublisher::Encode(uint64_t version, const std::vector<RankShard>& shards) {
  State& st = *state_;
  const std::string who = "rank " + std::to_string(st.rank);
  TERN_RETURN_IF_ERROR(st.broken);
  TERN_REQUIRE(version > st.version, kMismatch, who, ": version ", version,
               " is not newer than its previous view's ", st.version);
  TERN_ASSIGN_OR_RETURN(std::vector<const RankShard*> given, InOwnedOrder(st, shards));
  RankPart part;
  part.rank = st.rank;
  part.world_size = st.world_size;
  part.base_version = st.version;
  part.version = version;
  part.layout = st.layout;
  part.format_version = st.options.format_version;
  part.base_terms = st.terms;
  ViewDigest target = st.terms;
  // Views EncodeSegment indexes by tensor: only the shard's tensor is set.
  ServeView old_view, new_view;
  for (const TensorDesc& d : st.layout) {
    old_view.tensors.push_back({&d, nullptr});
    new_view.tensors.push_back({&d, nullptr});
  }
  st.pending_records.clear();
  st.has_pending = false;
  for (size_t k = 0; k < st.shards.size(); ++k) {
    State::Shard& s = st.shards[k];
    s.first_record = s.end_record = part.records.size();
    const DType dtype = st.layout[s.tensor].dtype;
    const uint64_t first = s.range.first_element, count = s.range.element_count;
    old_view.tensors[s.tensor].data = AsTensorBase(s.prev.data(), dtype, first);
    new_view.tensors[s.tensor].data =
        AsTensorBase(static_cast<const uint8_t*>(given[k]->data), dtype, first);
    uint64_t seg = std::min(st.options.segment_elements, kMaxSegment - 1);
    if (ElementBits(dtype) == 4 && seg % 2 == 1) ++seg;
    for (uint64_t at = 0; at < count; at += seg) {
      TERN_ASSIGN_OR_RETURN(SegmentRecord rec,
                            EncodeSegment(old_view, new_view, s.tensor, first + at,
                                          std::min(seg, count - at), st.options.format_version));
      if (rec.bytes.empty()) continue;
      target += rec.digest_delta;
      part.records.push_back(std::move(rec));
    }
    s.end_record = part.records.size();
    part.shards.push_back(s.range);
  }
  part.target_terms = target;
  // Kept until the root commits (the caller's buffers may change by then):
  // the changes, which Committed() applies to the previous view.
  st.pending_records = part.records;
  st.pending_version = version;
  st.pending_terms = target;
  st.has_pending = true;
  return part;
}

Status RankPublisher::Committed() {
  State& st = *state_;
  TERN_RETURN_IF_ERROR(st.broken);
  if (!st.has_pending) return Status::Ok();
  st.has_pending = false;
  // Each shard's records as a patch of their own (two shards of one tensor
  // need two base pointers), applied in place to its previous bytes: the
  // records were encoded from exactly these bytes, so this cannot refuse
  // them short of a bug or no memory; then the publisher is unusable.
  Status applied = Status::Ok();
  for (State::Shard& s : st.shards) {
    if (s.first_record == s.end_record) continue;
    if (!st.pool) st.pool = std::make_unique<ThreadPool>(1);
    ServeView descs;
    MutableServeView view;
    for (const TensorDesc& d : st.layout) {
      descs.tensors.push_back({&d, nullptr});
      view.tensors.push_back({&d, nullptr});
    }
    view.tensors[s.tensor].data = const_cast<uint8_t*>(
        AsTensorBase(s.prev.data(), st.layout[s.tensor].dtype, s.range.first_element));
    PatchBuilder builder(descs, st.version, st.pending_version, ViewDigest{}, st.options.format_version);
    for (size_t r = s.first_record; r < s.end_record && applied.ok(); ++r)
      applied = builder.Add(std::move(st.pending_records[r]));
    if (!applied.ok()) break;
    auto patch = builder.Finish();
    if (!patch.ok()) {
      applied = patch.status();
      break;
    }
    ApplyOptions options;
    options.exclusive_view = true;  // the publisher's own bytes
    applied = Apply(view, *patch, ViewDigest{}, *st.pool, options);
    if (!applied.ok()) break;
  }
  st.pending_records.clear();
  if (!applied.ok()) {
    st.broken = TERN_ERROR(kInternal, "rank ", st.rank, ": its previous view could not be advanced to version ",
                           st.pending_version, " (", applied.message().substr(0, 300),
                           "); create a new publisher and Resume it from HEAD's bytes");
    return st.broken;
  }
  st.version = st.pending_version;
  st.terms = st.pending_terms;
  return Status::Ok();
}

void RankPublisher::Abandon() {
  state_->has_pending = false;
  state_->pending_records.clear();
}

Status RankPublisher::Resume(uint64_t base_version, const std::vector<RankShard>& base) {
  TERN_RETURN_IF_ERROR(CanResume(base_version));
  TERN_ASSIGN_OR_RETURN(std::vector<const RankShard*> given, InOwnedOrder(*state_, base));
  size_t k = 0;
  return ResumeFrom(base_version,
                    [&](const TensorDesc&, const RankShardRange&, std::span<uint8_t> into) {
                      std::memcpy(into.data(), given[k++]->data, into.size());
                      return Status::Ok();
                    });
}

Status RankPublisher::CanResume(uint64_t base_version) const {
  const State& st = *state_;
  const std::string who = "rank " + std::to_string(st.rank);
  TERN_RETURN_IF_ERROR(st.broken);
  TERN_REQUIRE(st.version == 0, kMismatch, who, ": resume is for a publisher that has committed ",
               "nothing since it was created; this one holds version ", st.version,
               ": send its parts as usual");
  TERN_REQUIRE(base_version >= 1, kInvalidArgument, who, ": resume from version 0: a new ",
               "publisher already holds the zero view (send its part as usual)");
  return Status::Ok();
}

Status RankPublisher::ResumeFrom(uint64_t base_version, const FillFn& fill) {
  TERN_RETURN_IF_ERROR(CanResume(base_version));
  State& st = *state_;
  // The base's bytes straight into the previous view (no second copy of
  // the shards), then its element terms, hashed directly (one pass, the
  // digest's vector loop).
  ViewDigest terms;
  for (size_t k = 0; k < st.shards.size(); ++k) {
    State::Shard& s = st.shards[k];
    const TensorDesc& d = st.layout[s.tensor];
    // Back to the zero view it held when a fill fails or throws: what was
    // filled is no one's bytes.
    auto zero_filled = [&] {
      for (size_t j = 0; j <= k; ++j)
        std::fill(st.shards[j].prev.begin(), st.shards[j].prev.end(), 0);
    };
    Status filled;
    try {
      filled = fill(d, s.range, std::span<uint8_t>(s.prev));
    } catch (...) {
      zero_filled();
      throw;
    }
    if (!filled.ok()) {
      zero_filled();
      return filled;
    }
    const uint64_t first = s.range.first_element;
    terms += ComputeElementTerms(TensorRef{&d, AsTensorBase(s.prev.data(), d.dtype, first)}, first,
                                 first + s.range.element_count);
  }
  st.version = base_version;
  st.terms = terms;
  st.has_pending = false;
  st.pending_records.clear();
  return Status::Ok();
}

uint64_t RankPublisher::version() const { return state_->version; }

void RankPublisherTestPeer::DamagePendingRecords(RankPublisher& p) {
  // A changed segment placed past its tensor's end: PatchBuilder refuses it.
  for (SegmentRecord& r : p.state_->pending_records)
    if (!r.bytes.empty()) r.first_element = std::numeric_limits<uint64_t>::max() / 4;
}

ViewDigest ZeroViewDigest(const std::vector<TensorDesc>& layout) {
  ViewDigest d;
  for (const TensorDesc& t : layout) {
    d += TensorTerm(TensorSeed(t));
    d += ZeroTerms(t, 0, t.elements());
  }
  return d;
}

Result<std::vector<uint8_t>> AssembleRankParts(const std::vector<TensorDesc>& layout,
                                               uint64_t base_version, uint64_t version,
                                               const ViewDigest& base_digest,
                                               const std::vector<RankPart>& parts,
                                               uint32_t world_size, ViewDigest* target_digest) {
  TERN_RETURN_IF_ERROR(CheckLayout(layout));
  TERN_REQUIRE(world_size >= 1 && parts.size() == world_size, kInvalidArgument, "version ", version,
               ": ", parts.size(), " parts for a world of ", world_size, " ranks");
  const auto index = IndexOf(layout);
  struct Owned {
    uint32_t tensor;
    uint64_t first, count;
    uint32_t rank;
  };
  std::vector<Owned> owned;
  std::vector<bool> seen(world_size, false);
  uint16_t format = parts.front().format_version;
  ViewDigest base_sum;
  for (const TensorDesc& d : layout) base_sum += TensorTerm(TensorSeed(d));
  ViewDigest target = base_digest;
  for (const RankPart& p : parts) {
    const std::string who = "rank " + std::to_string(p.rank);
    TERN_REQUIRE(p.rank < world_size, kInvalidArgument, "unknown rank ", p.rank, " (world size ",
                 world_size, ")");
    TERN_REQUIRE(p.world_size == world_size, kInvalidArgument, who, " says the world has ",
                 p.world_size, " ranks, not ", world_size);
    TERN_REQUIRE(!seen[p.rank], kInvalidArgument, who, " sent two parts of version ", version);
    seen[p.rank] = true;
    TERN_REQUIRE(p.version == version && p.base_version == base_version, kInvalidArgument, who,
                 "'s part is ", p.base_version, " -> ", p.version, ", not ", base_version, " -> ",
                 version);
    TERN_REQUIRE(p.format_version == format, kInvalidArgument, who, " writes format ",
                 p.format_version, ", rank ", parts.front().rank, " format ", format);
    {
      for (size_t i = 0; i < std::max(p.layout.size(), layout.size()); ++i) {
        const bool same = i < p.layout.size() && i < layout.size() && p.layout[i].SameLayout(layout[i]);
        TERN_REQUIRE(same, kMismatch, who, "'s layout differs from the served one at tensor ",
                     (i < p.layout.size() ? p.layout[i] : layout[i]).name.substr(0, 200), " (",
                     p.layout.size(), " tensors, the served layout ", layout.size(), ")");
      }
    }
    std::vector<Owned> mine;
    for (const RankShardRange& r : p.shards) {
      uint32_t t = 0;
      TERN_RETURN_IF_ERROR(CheckRange(layout, index, r, who, &t));
      mine.push_back({t, r.first_element, r.element_count, p.rank});
    }
    ViewDigest deltas;
    for (const SegmentRecord& rec : p.records) {
      const bool inside = std::any_of(mine.begin(), mine.end(), [&](const Owned& o) {
        return o.tensor == rec.tensor_index && rec.first_element >= o.first &&
               rec.element_count <= o.count && rec.first_element - o.first <= o.count - rec.element_count;
      });
      TERN_REQUIRE(inside, kInvalidArgument, who, "'s segment ",
                   RangeText(rec.first_element, rec.element_count), " of tensor #", rec.tensor_index,
                   " lies outside its shards");
      deltas += rec.digest_delta;
    }
    ViewDigest expect = p.base_terms;
    expect += deltas;
    TERN_REQUIRE(expect == p.target_terms, kMismatch, who,
                 "'s segments do not take its shards' digest terms from base to target");
    base_sum += p.base_terms;
    target += deltas;
    owned.insert(owned.end(), mine.begin(), mine.end());
  }
  std::sort(owned.begin(), owned.end(), [](const Owned& a, const Owned& b) {
    return std::tie(a.tensor, a.first) < std::tie(b.tensor, b.first);
  });
  size_t k = 0;
  for (uint32_t t = 0; t < layout.size(); ++t) {
    uint64_t covered = 0;
    const Owned* last = nullptr;
    for (; k < owned.size() && owned[k].tensor == t; ++k) {
      const Owned& o = owned[k];
      TERN_REQUIRE(o.first >= covered, kInvalidArgument, "tensor ", layout[t].name, ": rank ",
                   o.rank, "'s shard ", RangeText(o.first, o.count), " overlaps rank ",
                   last->rank, "'s ", RangeText(last->first, last->count));
      TERN_REQUIRE(o.first == covered, kInvalidArgument, "tensor ", layout[t].name, ": elements ",
                   RangeText(covered, o.first - covered), " belong to no rank");
      covered = o.first + o.count;
      last = &o;
    }
    TERN_REQUIRE(covered == layout[t].elements(), kInvalidArgument, "tensor ", layout[t].name,
                 ": elements ", RangeText(covered, layout[t].elements() - covered),
                 " belong to no rank");
  }
  // After the coverage check: overlapping shards would count elements twice.
  TERN_REQUIRE(base_sum == base_digest, kMismatch, "the ranks' previous views add up to ",
               base_sum.ToString(), ", not D(", base_version, ") ", base_digest.ToString(),
               ": a rank's previous view is not the root's (did one restart?)");
  ServeView shape;
  for (const TensorDesc& d : layout) shape.tensors.push_back({&d, nullptr});
  PatchBuilder builder(shape, base_version, version, base_digest, format);
  for (const RankPart& p : parts)
    for (const SegmentRecord& rec : p.records) TERN_RETURN_IF_ERROR(builder.Add(rec));
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch, builder.Finish());
  if (target_digest != nullptr) *target_digest = target;
  return patch;
}

}  // namespace tern
