// Control message codec (spec: docs/format/agent.md, "Control messages").
#include "agent/control/control_wire.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <type_traits>

#include "base/coding.h"
#include "base/text.h"

namespace tern::agent {
namespace {

// ---- Writer ----
struct Writer {
  std::string out;
  Status status;

  void U8(uint8_t v) { PutFixed(&out, v, 1); }
  void U16(uint16_t v) { PutFixed16(&out, v); }
  void U32(uint32_t v) { PutFixed32(&out, v); }
  void U64(uint64_t v) { PutFixed64(&out, v); }
  void F64(double v) {
    if (!std::isfinite(v) || v < 0) Fail("a rate or time that is not finite and >= 0");
    U64(std::bit_cast<uint64_t>(v));
  }
  void Bytes(const uint8_t* p, size_t n) { out.append(reinterpret_cast<const char*>(p), n); }
  // u32 length + bytes.
  void Str(std::string_view s, size_t min, size_t max, const char* what) {
    if (s.size() < min || s.size() > max) {
      Fail(std::string(what) + " of " + std::to_string(s.size()) + " bytes (allowed " +
           std::to_string(min) + ".." + std::to_string(max) + ")");
      return;
    }
    U32(static_cast<uint32_t>(s.size()));
    out.append(s);
  }
  void Fail(std::string why) {
    if (status.ok()) status = Status(Code::kInvalidArgument, "control message: " + why);
  }
};

// ---- Reader ----
struct Reader {
  std::string_view in;
  Status status;

  bool ok() const { return status.ok(); }
  void Fail(std::string why) {
    if (status.ok()) status = Status(Code::kCorrupt, "control message: " + why);
  }
  uint64_t Fixed(int n, const char* what) {
    uint64_t v = 0;
    if (ok() && !GetFixed(&in, n, &v)) Fail(std::string("truncated at ") + what);
    return v;
  }
  uint8_t U8(const char* what) { return static_cast<uint8_t>(Fixed(1, what)); }
  uint16_t U16(const char* what) { return static_cast<uint16_t>(Fixed(2, what)); }
  uint32_t U32(const char* what) { return static_cast<uint32_t>(Fixed(4, what)); }
  uint64_t U64(const char* what) { return Fixed(8, what); }
  double F64(const char* what) {
    const double v = std::bit_cast<double>(U64(what));
    if (ok() && (!std::isfinite(v) || v < 0)) Fail(std::string(what) + " not finite and >= 0");
    return v;
  }
  bool Bool(const char* what) {
    const uint8_t v = U8(what);
    if (ok() && v > 1) Fail(std::string(what) + " not 0 or 1");
    return v == 1;
  }
  std::string Str(size_t min, size_t max, const char* what) {
    const uint32_t n = U32(what);
    if (!ok()) return {};
    if (n < min || n > max) {
      Fail(std::string(what) + " length " + std::to_string(n) + " outside " + std::to_string(min) +
           ".." + std::to_string(max));
      return {};
    }
    if (in.size() < n) {
      Fail(std::string("truncated in ") + what);
      return {};
    }
    std::string s(in.substr(0, n));
    in.remove_prefix(n);
    return s;
  }
  template <size_t N>
  void Array(std::array<uint8_t, N>* a, const char* what) {
    if (!ok()) return;
    if (in.size() < N) return Fail(std::string("truncated at ") + what);
    std::memcpy(a->data(), in.data(), N);
    in.remove_prefix(N);
  }
};

void Put(Writer& w, const MemberInfo& m) {
  w.Str(m.id, 1, kMaxControlIdBytes, "member id");
  w.Str(m.region, 1, kMaxControlIdBytes, "region");
  w.Str(m.cluster, 0, kMaxControlIdBytes, "cluster");
  w.Str(m.island, 0, kMaxControlIdBytes, "island");
  w.Str(m.data_address, 1, kMaxControlIdBytes, "data address");
  w.Str(m.intra_address, 0, kMaxControlIdBytes, "intra address");
  w.Str(m.intra_backend, 0, kMaxControlIdBytes, "intra backend");
  if (m.intra_address.empty() != m.intra_backend.empty())
    w.Fail("intra address and intra backend: give both or neither");
  w.U8(m.may_relay ? 1 : 0);
  w.U8(m.relay_only ? 1 : 0);
  w.F64(m.uplink_bytes_per_s);
  w.F64(m.downlink_bytes_per_s);
}
MemberInfo GetMember(Reader& r) {
  MemberInfo m;
  m.id = r.Str(1, kMaxControlIdBytes, "member id");
  m.region = r.Str(1, kMaxControlIdBytes, "region");
  m.cluster = r.Str(0, kMaxControlIdBytes, "cluster");
  m.island = r.Str(0, kMaxControlIdBytes, "island");
  m.data_address = r.Str(1, kMaxControlIdBytes, "data address");
  m.intra_address = r.Str(0, kMaxControlIdBytes, "intra address");
  m.intra_backend = r.Str(0, kMaxControlIdBytes, "intra backend");
  if (r.ok() && m.intra_address.empty() != m.intra_backend.empty())
    r.Fail("intra address and intra backend: give both or neither");
  m.may_relay = r.Bool("may_relay");
  m.relay_only = r.Bool("relay_only");
  m.uplink_bytes_per_s = r.F64("uplink rate");
  m.downlink_bytes_per_s = r.F64("downlink rate");
  return m;
}

void PutBody(Writer& w, const Hello& m) {
  w.U16(m.protocol);
  Put(w, m.member);
  w.Bytes(m.board_id.data(), m.board_id.size());
  w.U64(m.served_version);
  w.Str(m.join_token, 0, kMaxControlTokenBytes, "join token");
}
void PutBody(Writer& w, const Welcome& m) {
  if (m.heartbeat_ms == 0) w.Fail("heartbeat_ms 0");
  if (m.stripes < 1 || m.stripes > kMaxControlParents) w.Fail("stripes outside 1..8");
  w.Bytes(m.board_id.data(), m.board_id.size());
  w.U64(m.head);
  w.U32(m.heartbeat_ms);
  w.U32(m.stripes);
  w.U32(m.parent_stall_ms);
  w.Str(m.fetch_address, 0, kMaxControlIdBytes, "fetch address");
}
void PutBody(Writer& w, const Reject& m) { w.Str(m.reason, 0, kMaxControlTextBytes, "reason"); }
void PutBody(Writer& w, const Heartbeat& m) {
  w.U64(m.seq);
  w.U64(m.served_version);
  w.U64(m.receiving_version);
  w.U64(m.bytes_in);
  w.U64(m.bytes_out);
  w.U64(m.chunk_retries);
  w.F64(m.rtt_to_parent_s);
  w.F64(m.rate_in_bytes_per_s);
  w.F64(m.last_apply_s);
  w.F64(m.rtt_to_root_s);
  if (m.parents.size() > kMaxControlParents) w.Fail("parent figures count above 8");
  w.U32(static_cast<uint32_t>(m.parents.size()));
  for (const auto& p : m.parents) {
    w.F64(p.rtt_s);
    w.F64(p.rate_in_bytes_per_s);
  }
  w.F64(m.apply_f1_bytes_per_s);
  w.F64(m.apply_f2_bytes_per_s);
  w.U64(m.wire_bytes_in);
}
void PutBody(Writer& w, const Parents& m) {
  if (m.parents.empty() || m.parents.size() > kMaxControlParents) w.Fail("parents count outside 1..8");
  w.U64(m.epoch);
  w.U32(static_cast<uint32_t>(m.parents.size()));
  for (size_t i = 0; i < m.parents.size(); ++i) {
    if (m.parents[i].stripe != i) w.Fail("parents not in stripe order");
    w.U32(m.parents[i].stripe);
    w.Str(m.parents[i].id, 1, kMaxControlIdBytes, "parent id");
    w.Str(m.parents[i].data_address, 1, kMaxControlIdBytes, "parent address");
    w.U8(m.parents[i].intra ? 1 : 0);
  }
}
void PutBody(Writer& w, const Head& m) {
  w.U64(m.head);
  w.Str(m.signed_manifest, 1, kMaxControlManifestBytes, "signed manifest");
}
void PutBody(Writer& w, const CatchUpRequest& m) {
  // target == have asks for have's manifest alone (a member checking a
  // checkpoint it already holds, docs/agent.md §7). A target numbered
  // below have is a supersede's (docs/agent/board.md §4a): the root orders
  // them by position.
  if (m.target == 0) w.Fail("catch-up target 0");
  w.U64(m.have);
  w.U64(m.target);
}
void PutBody(Writer& w, const CatchUpReply& m) {
  if (m.signed_manifests.empty() || m.signed_manifests.size() > kMaxControlManifests)
    w.Fail("manifest count outside 1..64");
  if (m.objects.size() > kMaxControlObjects) w.Fail("object count above 4096");
  w.U64(m.target);
  w.U32(static_cast<uint32_t>(m.signed_manifests.size()));
  for (const auto& s : m.signed_manifests) w.Str(s, 1, kMaxControlManifestBytes, "signed manifest");
  w.U32(static_cast<uint32_t>(m.objects.size()));
  for (const auto& o : m.objects) {
    if (!ValidateObjectRef(o).ok()) w.Fail("an object reference that does not fit its kind");
    w.U8(static_cast<uint8_t>(o.kind));
    w.U64(o.from);
    w.U64(o.to);
  }
}
void PutBody(Writer&, const Leave&) {}
void PutBody(Writer& w, const Ping& m) { w.U64(m.nonce); }
void PutBody(Writer& w, const Pong& m) { w.U64(m.nonce); }
void PutBody(Writer& w, const ParentReport& m) {
  if (m.stripe >= kMaxControlParents) w.Fail("report stripe outside 0..7");
  if (m.fault != ParentFault::kStalled && m.fault != ParentFault::kBadChunks)
    w.Fail("unknown parent fault");
  w.U32(m.stripe);
  w.Str(m.parent_id, 1, kMaxControlIdBytes, "parent id");
  w.U8(static_cast<uint8_t>(m.fault));
}
void PutBody(Writer& w, const Beacon& m) {
  w.Str(m.signed_beacon, 1, kMaxSignedBeaconBytes, "signed beacon");
}
void PutBody(Writer& w, const KeySets& m) {
  if (m.signed_key_sets.empty() || m.signed_key_sets.size() > kMaxControlKeySets)
    w.Fail("key set count outside 1..64");
  w.U32(static_cast<uint32_t>(m.signed_key_sets.size()));
  for (const auto& s : m.signed_key_sets) w.Str(s, 1, kMaxSignedKeySetBytes, "signed key set");
}

template <class T>
T GetBody(Reader& r);

template <>
Hello GetBody<Hello>(Reader& r) {
  Hello m;
  m.protocol = r.U16("protocol");
  // The protocol comes first in every version's HELLO, so an older or
  // newer peer is refused with this reason, not a puzzling field error.
  if (r.ok() && m.protocol != kControlProtocol)
    r.Fail("control protocol " + std::to_string(m.protocol) + " (this agent speaks " +
           std::to_string(kControlProtocol) + "; run the same tern-agent release on the root and " +
           "every member)");
  m.member = GetMember(r);
  r.Array(&m.board_id, "board id");
  m.served_version = r.U64("served version");
  m.join_token = r.Str(0, kMaxControlTokenBytes, "join token");
  return m;
}
template <>
Welcome GetBody<Welcome>(Reader& r) {
  Welcome m;
  r.Array(&m.board_id, "board id");
  m.head = r.U64("head");
  m.heartbeat_ms = r.U32("heartbeat_ms");
  m.stripes = r.U32("stripes");
  m.parent_stall_ms = r.U32("parent_stall_ms");
  if (r.ok() && m.heartbeat_ms == 0) r.Fail("heartbeat_ms 0");
  if (r.ok() && (m.stripes < 1 || m.stripes > kMaxControlParents)) r.Fail("stripes outside 1..8");
  m.fetch_address = r.Str(0, kMaxControlIdBytes, "fetch address");
  return m;
}
template <>
Reject GetBody<Reject>(Reader& r) {
  return Reject{r.Str(0, kMaxControlTextBytes, "reason")};
}
template <>
Heartbeat GetBody<Heartbeat>(Reader& r) {
  Heartbeat m;
  m.seq = r.U64("seq");
  m.served_version = r.U64("served version");
  m.receiving_version = r.U64("receiving version");
  m.bytes_in = r.U64("bytes in");
  m.bytes_out = r.U64("bytes out");
  m.chunk_retries = r.U64("chunk retries");
  m.rtt_to_parent_s = r.F64("rtt");
  m.rate_in_bytes_per_s = r.F64("rate in");
  m.last_apply_s = r.F64("apply time");
  m.rtt_to_root_s = r.F64("rtt to root");
  const uint32_t n = r.U32("parent figures count");
  if (r.ok() && n > kMaxControlParents) r.Fail("parent figures count above 8");
  for (uint32_t i = 0; r.ok() && i < n; ++i) {
    ParentFigures p;
    p.rtt_s = r.F64("parent rtt");
    p.rate_in_bytes_per_s = r.F64("parent rate in");
    m.parents.push_back(p);
  }
  m.apply_f1_bytes_per_s = r.F64("format 1 apply rate");
  m.apply_f2_bytes_per_s = r.F64("format 2 apply rate");
  m.wire_bytes_in = r.U64("wire bytes in");
  return m;
}
template <>
Parents GetBody<Parents>(Reader& r) {
  Parents m;
  m.epoch = r.U64("epoch");
  const uint32_t n = r.U32("parents count");
  if (r.ok() && (n < 1 || n > kMaxControlParents)) r.Fail("parents count outside 1..8");
  for (uint32_t i = 0; r.ok() && i < n; ++i) {
    ParentRef p;
    p.stripe = r.U32("stripe");
    if (r.ok() && p.stripe != i) r.Fail("parents not in stripe order");
    p.id = r.Str(1, kMaxControlIdBytes, "parent id");
    p.data_address = r.Str(1, kMaxControlIdBytes, "parent address");
    p.intra = r.Bool("intra");
    m.parents.push_back(std::move(p));
  }
  return m;
}
template <>
Head GetBody<Head>(Reader& r) {
  Head m;
  m.head = r.U64("head");
  m.signed_manifest = r.Str(1, kMaxControlManifestBytes, "signed manifest");
  return m;
}
template <>
CatchUpRequest GetBody<CatchUpRequest>(Reader& r) {
  CatchUpRequest m;
  m.have = r.U64("have");
  m.target = r.U64("target");
  if (r.ok() && m.target == 0) r.Fail("catch-up target 0");
  return m;
}
template <>
CatchUpReply GetBody<CatchUpReply>(Reader& r) {
  CatchUpReply m;
  m.target = r.U64("target");
  const uint32_t nm = r.U32("manifest count");
  if (r.ok() && (nm < 1 || nm > kMaxControlManifests)) r.Fail("manifest count outside 1..64");
  for (uint32_t i = 0; r.ok() && i < nm; ++i)
    m.signed_manifests.push_back(r.Str(1, kMaxControlManifestBytes, "signed manifest"));
  const uint32_t no = r.U32("object count");
  if (r.ok() && no > kMaxControlObjects) r.Fail("object count above 4096");
  for (uint32_t i = 0; r.ok() && i < no; ++i) {
    ObjectRef o;
    const uint8_t kind = r.U8("object kind");
    if (r.ok() && (kind < 1 || kind > 3)) r.Fail("object kind " + std::to_string(kind));
    o.kind = static_cast<ObjectKind>(kind);
    o.from = r.U64("object from");
    o.to = r.U64("object to");
    if (r.ok()) {
      Status valid = ValidateObjectRef(o);
      if (!valid.ok()) r.Fail(valid.message());
    }
    m.objects.push_back(o);
  }
  return m;
}
template <>
Leave GetBody<Leave>(Reader&) {
  return Leave{};
}
template <>
Ping GetBody<Ping>(Reader& r) {
  return Ping{r.U64("nonce")};
}
template <>
Pong GetBody<Pong>(Reader& r) {
  return Pong{r.U64("nonce")};
}
template <>
ParentReport GetBody<ParentReport>(Reader& r) {
  ParentReport m;
  m.stripe = r.U32("report stripe");
  if (r.ok() && m.stripe >= kMaxControlParents) r.Fail("report stripe outside 0..7");
  m.parent_id = r.Str(1, kMaxControlIdBytes, "parent id");
  const uint8_t fault = r.U8("parent fault");
  if (r.ok() && fault != 1 && fault != 2) r.Fail("parent fault " + std::to_string(fault));
  m.fault = static_cast<ParentFault>(fault);
  return m;
}
template <>
Beacon GetBody<Beacon>(Reader& r) {
  return Beacon{r.Str(1, kMaxSignedBeaconBytes, "signed beacon")};
}
template <>
KeySets GetBody<KeySets>(Reader& r) {
  KeySets m;
  const uint32_t n = r.U32("key set count");
  if (r.ok() && (n < 1 || n > kMaxControlKeySets)) r.Fail("key set count outside 1..64");
  for (uint32_t i = 0; r.ok() && i < n; ++i)
    m.signed_key_sets.push_back(r.Str(1, kMaxSignedKeySetBytes, "signed key set"));
  return m;
}

template <class T>
Result<ControlMessage> Finish(Reader& r) {
  T m = GetBody<T>(r);
  if (r.ok() && !r.in.empty()) r.Fail(std::to_string(r.in.size()) + " trailing bytes");
  if (!r.ok()) return r.status;
  return ControlMessage(std::move(m));
}

}  // namespace

ControlType TypeOf(const ControlMessage& m) {
  static constexpr ControlType kTypes[] = {
      ControlType::kHello,          ControlType::kWelcome,      ControlType::kReject,
      ControlType::kHeartbeat,      ControlType::kParents,      ControlType::kHead,
      ControlType::kCatchUpRequest, ControlType::kCatchUpReply, ControlType::kLeave,
      ControlType::kPing,           ControlType::kPong,         ControlType::kParentReport,
      ControlType::kBeacon,         ControlType::kKeySets};
  static_assert(std::size(kTypes) == std::variant_size_v<ControlMessage>);
  return kTypes[m.index()];
}

const char* ControlTypeName(ControlType t) {
  switch (t) {
    case ControlType::kHello: return "HELLO";
    case ControlType::kWelcome: return "WELCOME";
    case ControlType::kReject: return "REJECT";
    case ControlType::kHeartbeat: return "HEARTBEAT";
    case ControlType::kParents: return "PARENTS";
    case ControlType::kHead: return "HEAD";
    case ControlType::kCatchUpRequest: return "CATCHUP_REQUEST";
    case ControlType::kCatchUpReply: return "CATCHUP_REPLY";
    case ControlType::kLeave: return "LEAVE";
    case ControlType::kPing: return "PING";
    case ControlType::kPong: return "PONG";
    case ControlType::kParentReport: return "PARENT_REPORT";
    case ControlType::kBeacon: return "BEACON";
    case ControlType::kKeySets: return "KEY_SETS";
  }
  return "?";
}

const char* ParentFaultName(ParentFault f) {
  switch (f) {
    case ParentFault::kStalled: return "stalled";
    case ParentFault::kBadChunks: return "bad chunks";
  }
  return "?";
}

Result<std::string> EncodeControl(const ControlMessage& m) {
  Writer w;
  w.U8(static_cast<uint8_t>(TypeOf(m)));
  w.U8(0);
  w.U16(0);
  std::visit([&](const auto& body) { PutBody(w, body); }, m);
  if (!w.status.ok()) return w.status;
  return std::move(w.out);
}

Result<ControlMessage> DecodeControl(std::string_view bytes) {
  Reader r{bytes, Status::Ok()};
  const uint8_t type = r.U8("type");
  const uint8_t reserved8 = r.U8("reserved");
  const uint16_t reserved16 = r.U16("reserved");
  if (!r.ok()) return r.status;
  if (reserved8 != 0 || reserved16 != 0) return Status(Code::kCorrupt, "control message: reserved bytes not zero");
  switch (static_cast<ControlType>(type)) {
    case ControlType::kHello: return Finish<Hello>(r);
    case ControlType::kWelcome: return Finish<Welcome>(r);
    case ControlType::kReject: return Finish<Reject>(r);
    case ControlType::kHeartbeat: return Finish<Heartbeat>(r);
    case ControlType::kParents: return Finish<Parents>(r);
    case ControlType::kHead: return Finish<Head>(r);
    case ControlType::kCatchUpRequest: return Finish<CatchUpRequest>(r);
    case ControlType::kCatchUpReply: return Finish<CatchUpReply>(r);
    case ControlType::kLeave: return Finish<Leave>(r);
    case ControlType::kPing: return Finish<Ping>(r);
    case ControlType::kPong: return Finish<Pong>(r);
    case ControlType::kParentReport: return Finish<ParentReport>(r);
    case ControlType::kBeacon: return Finish<Beacon>(r);
    case ControlType::kKeySets: return Finish<KeySets>(r);
  }
  return Status(Code::kCorrupt, "control message: unknown type 0x" + Hex({&type, 1}));
}

}  // namespace tern::agent
