// PublishVersion and MakeSquash (agent/board/publish.h).
#include "agent/board/publish.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "tern/patch.h"
#include "tern/transport.h"

namespace tern::agent {
namespace {


// Read-only zero bytes for the zero view: an anonymous private mapping
// reads as the kernel's shared zero page, so a keyframe's base costs no
// memory however large the largest tensor is.
class ZeroBytes {
 public:
  static Result<ZeroBytes> Map(uint64_t size_bytes) {
    ZeroBytes z;
    if (size_bytes == 0) return z;
    void* p = mmap(nullptr, size_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return TERN_ERRNO("mapping ", size_bytes, " zero bytes for a keyframe");
    z.data_ = static_cast<const uint8_t*>(p);
    z.size_ = size_bytes;
    return z;
  }
  ZeroBytes(ZeroBytes&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr; }
  ZeroBytes& operator=(ZeroBytes&&) = delete;
  ~ZeroBytes() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  }
  const uint8_t* data() const { return data_ != nullptr ? data_ : &kEmpty; }

 private:
  ZeroBytes() = default;
  static constexpr uint8_t kEmpty = 0;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

uint64_t NowUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::span<const uint8_t> Span(const std::vector<uint8_t>& v) { return {v.data(), v.size()}; }

// Adds the time from construction (or the last Lap) to a span, on the
// board Env's clock.
class SpanTimer {
 public:
  explicit SpanTimer(Clock& clock) : clock_(clock), start_us_(clock.NowUs()), lap_us_(start_us_) {}
  void Lap(double& span_s) {
    const uint64_t now_us = clock_.NowUs();
    span_s += static_cast<double>(now_us - lap_us_) * 1e-6;
    lap_us_ = now_us;
  }
  double TotalS() const { return static_cast<double>(clock_.NowUs() - start_us_) * 1e-6; }

 private:
  Clock& clock_;
  const uint64_t start_us_;
  uint64_t lap_us_;
};

struct PendingObject {
  ObjectRef ref;
  std::vector<uint8_t> bytes;
};

// Describes, signs, writes the files, records. Files this call wrote are
// removed again when anything after them fails.
Result<PublishResult> Commit(Board& board, const ManifestSigner& signer, VersionManifest m,
                             const std::vector<PendingObject>& objects,
                             const PublishOptions& options, ThreadPool& pool, PublishSpans spans,
                             SpanTimer& timer) {
  for (const PendingObject& o : objects) {
    TERN_REQUIRE(!board.HasObject(o.ref), kAlreadyExists, "publish: ",
                 ObjectName(o.ref), " exists on the board");
    const uint32_t chunk = options.chunk_bytes ? options.chunk_bytes : DefaultChunkBytes(o.bytes.size());
    TERN_ASSIGN_OR_RETURN(ManifestObject mo, DescribeObject(o.ref, Span(o.bytes), chunk, pool));
    m.objects.push_back(mo);
  }
  timer.Lap(spans.hash_s);
  std::sort(m.objects.begin(), m.objects.end(), [](const ManifestObject& a, const ManifestObject& b) {
    return std::pair(a.kind, a.from_version) < std::pair(b.kind, b.from_version);
  });
  TERN_ASSIGN_OR_RETURN(std::string signed_bytes, signer.Sign(m));
  timer.Lap(spans.sign_s);
  std::vector<std::string> written;
  Status st;
  for (const PendingObject& o : objects) {
    const std::string path = board.ObjectPath(o.ref);
    // overwrite: a file of this name can only be a crashed publish's leftover.
    st = WriteFileAtomic(board.env(), path, Span(o.bytes), /*overwrite=*/true);
    if (!st.ok()) break;
    written.push_back(path);
  }
  timer.Lap(spans.write_s);
  // Record only after every object file is synced (WriteFileAtomic): a
  // recorded version's bytes are durable, and the root offers a version's
  // objects to the tree only after Record (docs/agent/board.md §4).
  if (st.ok()) st = board.Record(signed_bytes);
  timer.Lap(spans.record_s);
  if (!st.ok()) {
    // Unless the record landed after all (Record indexed it): then the
    // version is published and its bytes must stay.
    for (size_t i = 0; i < written.size(); ++i)
      if (!board.HasObject(objects[i].ref)) (void)board.env().RemoveFile(written[i]);
    return st;
  }
  PublishResult r;
  r.manifest = std::move(m);
  r.signed_manifest = std::move(signed_bytes);
  r.spans = spans;
  r.spans.total_s = timer.TotalS();
  for (const PendingObject& o : objects) {
    uint64_t& field = o.ref.kind == ObjectKind::kPatch      ? r.patch_bytes
                      : o.ref.kind == ObjectKind::kKeyframe ? r.keyframe_bytes
                                                            : r.squash_bytes;
    field = o.bytes.size();
  }
  return r;
}

// The objects of a path, mapped read-only, in order.
struct MappedChain {
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::vector<std::span<const uint8_t>> parts;
};

Result<MappedChain> MapChain(Board& board, const std::vector<ObjectRef>& path) {
  MappedChain chain;
  for (const ObjectRef& part : path) {
    TERN_ASSIGN_OR_RETURN(auto map, board.env().Map(board.ObjectPath(part), MapMode::kReadOnly));
    chain.parts.push_back(map->bytes());
    chain.maps.push_back(std::move(map));
  }
  return chain;
}

// A view of version `version` (0: the zero view) in memory, laid out as a
// patch's manifest says, rebuilt from the board's objects alone: the
// cheapest chain from nothing (a keyframe and what follows it) applied to
// zeros. Costs the view's size in memory and one apply per object (each
// checked against the digests, so a damaged object file fails it); a root
// that took the board over lacks the objects before the takeover, and then
// this fails and catch-up sends the chain instead.
struct RebuiltView {
  std::vector<TensorDesc> descs;
  std::vector<std::vector<uint8_t>> bytes;  // empty for the zero view
  std::optional<ZeroBytes> zeros;           // the zero view's bytes
  ServeView view;
};

Result<std::unique_ptr<RebuiltView>> RebuildView(Board& board, uint64_t version,
                                                 const PatchInfo& layout, ThreadPool& pool) {
  auto r = std::make_unique<RebuiltView>();
  uint64_t largest = 0;
  for (const TensorPatchInfo& t : layout.tensors) {
    r->descs.push_back({t.name, t.dtype, t.shape});
    largest = std::max(largest, r->descs.back().bytes());
  }
  if (version == 0) {
    TERN_ASSIGN_OR_RETURN(ZeroBytes zeros, ZeroBytes::Map(largest));
    r->zeros.emplace(std::move(zeros));
    for (const TensorDesc& d : r->descs) r->view.tensors.push_back({&d, r->zeros->data()});
    return r;
  }
  MutableServeView work;
  for (const TensorDesc& d : r->descs) {
    r->bytes.emplace_back(d.bytes(), uint8_t{0});
    work.tensors.push_back({&d, r->bytes.back().data()});
  }
  TERN_ASSIGN_OR_RETURN(std::vector<ObjectRef> path, board.CheapestPath(0, version));
  TERN_ASSIGN_OR_RETURN(MappedChain chain, MapChain(board, path));
  ViewDigest digest = ComputeDigest(AsConst(work), pool);
  ApplyOptions exclusive;
  exclusive.exclusive_view = true;  // private memory
  for (size_t i = 0; i < chain.parts.size(); ++i) {
    ViewDigest next;
    Status s = Apply(work, chain.parts[i], digest, pool, exclusive, &next);
    if (!s.ok())
      return s.WithContext("rebuilding v" + std::to_string(version) + " from " +
                           ObjectName(path[i]));
    digest = next;
  }
  r->view = AsConst(work);
  return r;
}

}  // namespace

Result<ManifestObject> DescribeObject(const ObjectRef& ref, std::span<const uint8_t> bytes,
                                      uint32_t chunk_bytes, ThreadPool& pool) {
  TERN_REQUIRE(!bytes.empty(), kInvalidArgument, "publish: ", ObjectName(ref), " is empty");
  TERN_REQUIRE(chunk_bytes >= 1 && chunk_bytes <= kMaxChunkBytes, kInvalidArgument,
               "publish: chunk_bytes ", chunk_bytes, " outside [1, ", kMaxChunkBytes, "]");
  const uint64_t chunks = (bytes.size() - 1) / chunk_bytes + 1;
  TERN_REQUIRE(chunks <= kMaxManifestChunks, kOutOfRange, "publish: ", ObjectName(ref),
               " would have ", chunks, " chunks, more than ", kMaxManifestChunks);
  std::vector<Sha256Hash> hashes(chunks);
  pool.ParallelFor(chunks, [&](uint64_t i) {
    const uint64_t at = i * chunk_bytes;
    hashes[i] = Sha256Of(bytes.subspan(at, std::min<uint64_t>(chunk_bytes, bytes.size() - at)));
  });
  ManifestObject o;
  o.kind = ref.kind;
  o.from_version = ref.from;
  o.to_version = ref.to;
  o.bytes = bytes.size();
  o.chunk_bytes = chunk_bytes;
  o.chunk_count = static_cast<uint32_t>(chunks);
  o.chunk_hashes_root = ChunkHashRoot(hashes);
  return o;
}

Result<PublishResult> PublishVersion(Board& board, const ManifestSigner& signer,
                                     const ServeView* prev, const ViewDigest& prev_digest,
                                     const ServeView& next, uint64_t version,
                                     const PublishOptions& options, ThreadPool& pool) {
  SpanTimer timer(board.env().clock());
  PublishSpans spans;
  const BoardPos head_pos = board.head_pos();
  const uint64_t head = head_pos.version;
  if (options.supersede) {
    // Board::Record re-checks all of it; here nothing is diffed first.
    TERN_REQUIRE(head != 0 && version < head && prev != nullptr, kInvalidArgument,
                 "publish: a supersede renumbers below HEAD ", head, " from HEAD's view; ",
                 "version ", version, prev ? "" : " without a previous view");
    TERN_REQUIRE(!board.PosOf(version).ok(), kAlreadyExists, "publish: version ", version,
                 " is in the board's log already; a number is not used twice");
  } else {
    TERN_REQUIRE(version > head, kInvalidArgument, "publish: version ", version,
                 " is not newer than HEAD ", head);
  }
  TERN_REQUIRE((prev == nullptr) == (head == 0) || (options.keyframe_only && prev == nullptr),
               kInvalidArgument,
               prev ? "publish: a previous view for an empty board"
                    : "publish: no previous view, but the board is at version ", head);
  VersionManifest m;
  m.board_id = board.id();
  m.version = version;
  m.parent = head;
  m.epoch = head_pos.epoch + (options.supersede ? 1 : 0);
  m.supersede = options.supersede;
  m.created_unix_ms = options.created_unix_ms ? options.created_unix_ms : NowUnixMs();
  m.files = options.files;
  std::vector<PendingObject> objects;
  if (prev == nullptr && head != 0) {
    TERN_ASSIGN_OR_RETURN(VersionManifest parent, board.Manifest(head));
    m.base_digest = parent.target_digest;
  }
  if (prev != nullptr) {
    TERN_ASSIGN_OR_RETURN(VersionManifest parent, board.Manifest(head));
    TERN_REQUIRE(prev_digest == parent.target_digest, kMismatch, "publish: prev_digest ",
                 prev_digest.ToString(), " is not D(", head, ") ", parent.target_digest.ToString());
    timer.Lap(spans.verify_prev_s);
    DiffOptions diff{options.segment_elements, head, version};
    diff.format_version = options.format_version;
    diff.nibble_coding = options.nibble_coding;
    // D(prev) is computed in the diff's own pass over prev's bytes and
    // checked here, before the patch is inspected, a keyframe made or
    // anything signed or written: a wrong prev would publish a patch no
    // member can apply.
    ViewDigest actual;
    TERN_ASSIGN_OR_RETURN(auto patch, Diff(*prev, next, diff, pool, &prev_digest,
                                           options.verify_prev_digest ? &actual : nullptr));
    if (options.verify_prev_digest) {
      TERN_REQUIRE(actual == prev_digest, kMismatch, "publish: the previous view's digest is ",
                   actual.ToString(), ", not D(", head, ")");
    }
    TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(Span(patch)));
    m.base_digest = prev_digest;
    m.target_digest = info.target_digest;
    objects.push_back({{ObjectKind::kPatch, head, version}, std::move(patch)});
    timer.Lap(spans.diff_s);
  }
  if (prev == nullptr || options.with_keyframe || options.supersede ||
      board.KeyframeDue(version, objects.front().bytes.size())) {
    uint64_t largest = 0;
    for (const auto& t : next.tensors) largest = std::max(largest, t.desc->bytes());
    TERN_ASSIGN_OR_RETURN(ZeroBytes zeros, ZeroBytes::Map(largest));
    ServeView zero = next;
    for (auto& t : zero.tensors) t.data = zeros.data();
    DiffOptions diff{options.segment_elements, 0, version};
    diff.format_version = options.format_version;
    diff.nibble_coding = options.nibble_coding;
    TERN_ASSIGN_OR_RETURN(auto keyframe, Diff(zero, next, diff, pool));
    TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(Span(keyframe)));
    TERN_REQUIRE(prev == nullptr || info.target_digest == m.target_digest, kInternal,
                 "publish: keyframe and patch of version ", version, " disagree on D(", version, ")");
    m.target_digest = info.target_digest;
    objects.push_back({{ObjectKind::kKeyframe, version, version}, std::move(keyframe)});
    timer.Lap(spans.keyframe_s);
  }
  return Commit(board, signer, std::move(m), objects, options, pool, spans, timer);
}

Result<PublishResult> PublishPatch(Board& board, const ManifestSigner& signer,
                                   std::vector<uint8_t> patch, uint64_t version,
                                   const PublishOptions& options, ThreadPool& pool) {
  SpanTimer timer(board.env().clock());
  PublishSpans spans;
  const BoardPos head_pos = board.head_pos();
  const uint64_t head = head_pos.version;
  TERN_REQUIRE(version > head, kInvalidArgument, "publish: version ", version,
               " is not newer than HEAD ", head);
  TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(Span(patch)));
  timer.Lap(spans.diff_s);
  TERN_REQUIRE(info.base_version == head && info.target_version == version, kMismatch,
               "publish: a patch ", info.base_version, " -> ", info.target_version,
               " cannot publish ", head, " -> ", version);
  VersionManifest m;
  m.board_id = board.id();
  m.version = version;
  m.parent = head;
  m.epoch = head_pos.epoch;
  m.created_unix_ms = options.created_unix_ms ? options.created_unix_ms : NowUnixMs();
  m.files = options.files;
  m.target_digest = info.target_digest;
  std::vector<PendingObject> objects;
  if (head == 0) {
    objects.push_back({{ObjectKind::kKeyframe, version, version}, std::move(patch)});
  } else {
    TERN_ASSIGN_OR_RETURN(VersionManifest parent, board.Manifest(head));
    TERN_REQUIRE(info.base_digest == parent.target_digest, kMismatch, "publish: the patch's base ",
                 info.base_digest.ToString(), " is not D(", head, ") ", parent.target_digest.ToString());
    m.base_digest = parent.target_digest;
    objects.push_back({{ObjectKind::kPatch, head, version}, std::move(patch)});
  }
  return Commit(board, signer, std::move(m), objects, options, pool, spans, timer);
}

Result<PublishResult> MakeSquash(Board& board, const ManifestSigner& signer, uint64_t from,
                                 uint64_t to, const PublishOptions& options, ThreadPool& pool) {
  SpanTimer timer(board.env().clock());
  PublishSpans spans;
  TERN_ASSIGN_OR_RETURN(VersionManifest pub, board.Manifest(to));
  // Older on the chain: by position, since a supersede renumbers downwards.
  const Result<BoardPos> from_pos = board.PosOf(from), parent_pos = board.PosOf(pub.parent);
  TERN_REQUIRE(from == 0 || (from != pub.parent && from_pos.ok() && parent_pos.ok() &&
                             *from_pos < *parent_pos),
               kInvalidArgument, "squash: from ", from, " must be 0 (a keyframe) or older than ",
               to, "'s parent ", pub.parent);
  const ObjectRef ref = from == 0 ? ObjectRef{ObjectKind::kKeyframe, to, to}
                                  : ObjectRef{ObjectKind::kSquash, from, to};
  TERN_REQUIRE(!board.HasObject(ref), kAlreadyExists, "squash: ", ObjectName(ref), " exists");
  TERN_ASSIGN_OR_RETURN(std::vector<ObjectRef> path, board.CheapestPath(from, to));
  TERN_ASSIGN_OR_RETURN(MappedChain chain, MapChain(board, path));
  // Without the base a squash keeps its inputs' codings; with nibble coding
  // off (readers that predate patch version 3) nibble-coded inputs (written
  // before the switch) are kUnsupported and re-encoded on the base below.
  auto squash = Squash(chain.parts, pool, options.nibble_coding);
  if (squash.status().code() == Code::kUnsupported) {
    // Format-2 objects code changes given their base: rebuild view(from)
    // from the board's own objects and squash on it (format 2 again).
    TERN_ASSIGN_OR_RETURN(PatchInfo layout, Inspect(chain.parts.front()));
    TERN_ASSIGN_OR_RETURN(auto base, RebuildView(board, from, layout, pool));
    DiffOptions diff;
    diff.segment_elements = options.segment_elements;
    diff.nibble_coding = options.nibble_coding;
    squash = SquashOnBase(base->view, chain.parts, diff, pool);
  }
  if (!squash.ok()) return squash.status().WithContext("squash " + ObjectName(ref));
  chain = {};
  // The chain was signed object by object; the squash is checked against
  // the signed digests before it is signed itself.
  TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(Span(*squash)));
  TERN_REQUIRE(info.target_digest == pub.target_digest, kMismatch, "squash: ", ObjectName(ref),
               " does not reach D(", to, ")");
  if (from > 0) {
    TERN_ASSIGN_OR_RETURN(VersionManifest base, board.Manifest(from));
    TERN_REQUIRE(info.base_digest == base.target_digest, kMismatch, "squash: ",
                 ObjectName(ref), " does not start at D(", from, ")");
  }
  VersionManifest m;
  m.board_id = board.id();
  m.version = to;
  m.parent = pub.parent;
  m.epoch = pub.epoch;  // a later manifest repeats its version's epoch, never supersedes
  m.created_unix_ms = options.created_unix_ms ? options.created_unix_ms : NowUnixMs();
  m.base_digest = pub.base_digest;
  m.target_digest = pub.target_digest;
  m.files = pub.files;  // every manifest of a version names its files
  std::vector<PendingObject> objects;
  objects.push_back({ref, std::move(squash).value()});
  timer.Lap(spans.diff_s);
  return Commit(board, signer, std::move(m), objects, options, pool, spans, timer);
}

}  // namespace tern::agent
