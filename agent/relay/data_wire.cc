// Data-plane message codec (docs/format/agent.md §7).
#include "agent/relay/data_wire.h"

#include <algorithm>
#include <cstring>

#include "base/coding.h"

namespace tern::agent {
namespace {

constexpr size_t kHeaderBytes = 4;
constexpr size_t kRefBytes = 24;  // u8 kind, 7 reserved, u64 from, u64 to

std::string Header(DataType type) {
  std::string out;
  out.push_back(static_cast<char>(type));
  out.append(3, '\0');
  return out;
}

// Checks the 4-byte header and consumes it.
Status TakeHeader(std::string_view* in, DataType type) {
  TERN_REQUIRE(in->size() >= kHeaderBytes, kCorrupt, "data message of ", in->size(),
               " bytes is shorter than its header");
  TERN_REQUIRE(static_cast<uint8_t>((*in)[0]) == static_cast<uint8_t>(type), kProtocol,
               "data message type 0x", std::hex, static_cast<int>(static_cast<uint8_t>((*in)[0])),
               " where 0x", static_cast<int>(type), " was expected");
  TERN_REQUIRE((*in)[1] == 0 && (*in)[2] == 0 && (*in)[3] == 0, kCorrupt,
               "data message header: reserved bytes not zero");
  in->remove_prefix(kHeaderBytes);
  return Status::Ok();
}

void PutRef(std::string* out, const ObjectRef& ref) {
  out->push_back(static_cast<char>(ref.kind));
  out->append(7, '\0');
  PutFixed64(out, ref.from);
  PutFixed64(out, ref.to);
}

Result<ObjectRef> TakeRef(std::string_view* in) {
  TERN_REQUIRE(in->size() >= kRefBytes, kCorrupt, "object reference truncated");
  ObjectRef ref;
  ref.kind = static_cast<ObjectKind>(static_cast<uint8_t>((*in)[0]));
  for (int i = 1; i < 8; ++i) {
    TERN_REQUIRE((*in)[i] == 0, kCorrupt, "object reference: reserved bytes not zero");
  }
  ref.from = DecodeFixedAt(*in, 8, 8);
  ref.to = DecodeFixedAt(*in, 16, 8);
  in->remove_prefix(kRefBytes);
  TERN_RETURN_IF_ERROR(ValidateObjectRef(ref));
  return ref;
}

Status RequireEnd(std::string_view in, const char* what) {
  TERN_REQUIRE(in.empty(), kCorrupt, what, ": ", in.size(), " trailing bytes");
  return Status::Ok();
}

}  // namespace

uint8_t DataTypeOf(std::string_view message) {
  return message.empty() ? 0 : static_cast<uint8_t>(message[0]);
}

std::string EncodeSubscribe(const Subscribe& m) {
  TERN_ASSERT(!m.member_id.empty() && m.member_id.size() <= kMaxMemberIdBytes);
  TERN_ASSERT(m.stripes >= 1 && m.stripes <= kMaxStripes && m.stripe < m.stripes);
  std::string out = Header(DataType::kSubscribe);
  PutFixed16(&out, m.stripe);
  PutFixed16(&out, m.stripes);
  PutFixed32(&out, static_cast<uint32_t>(m.member_id.size()));
  out += m.member_id;
  TERN_ASSERT(m.token.size() <= kMaxTokenBytes);
  PutFixed32(&out, static_cast<uint32_t>(m.token.size()));
  out += m.token;
  PutFixed64(&out, m.served_version);
  TERN_ASSERT(m.push_window_bytes <= kMaxPushWindowBytes);
  PutFixed32(&out, m.push_window_bytes);
  return out;
}

Result<Subscribe> DecodeSubscribe(std::string_view in) {
  TERN_RETURN_IF_ERROR(TakeHeader(&in, DataType::kSubscribe));
  Subscribe m;
  uint32_t id_bytes = 0;
  TERN_REQUIRE(GetFixed16(&in, &m.stripe) && GetFixed16(&in, &m.stripes) &&
                   GetFixed32(&in, &id_bytes),
               kCorrupt, "SUBSCRIBE truncated");
  TERN_REQUIRE(m.stripes >= 1 && m.stripes <= kMaxStripes && m.stripe < m.stripes, kCorrupt,
               "SUBSCRIBE: stripe ", m.stripe, " of ", m.stripes, " (at most ", kMaxStripes, ")");
  TERN_REQUIRE(id_bytes >= 1 && id_bytes <= kMaxMemberIdBytes && id_bytes <= in.size(), kCorrupt,
               "SUBSCRIBE: member id of ", id_bytes, " bytes with ", in.size(), " left (1..",
               kMaxMemberIdBytes, ")");
  m.member_id.assign(in.substr(0, id_bytes));
  in.remove_prefix(id_bytes);
  uint32_t token_bytes = 0;
  TERN_REQUIRE(GetFixed32(&in, &token_bytes), kCorrupt, "SUBSCRIBE truncated at the token");
  TERN_REQUIRE(token_bytes <= kMaxTokenBytes && uint64_t{token_bytes} + 12 == in.size(), kCorrupt,
               "SUBSCRIBE: token of ", token_bytes, " bytes, a served version and a push window with ",
               in.size(), " left (token at most ", kMaxTokenBytes, ")");
  m.token.assign(in.substr(0, token_bytes));
  in.remove_prefix(token_bytes);
  TERN_REQUIRE(GetFixed64(&in, &m.served_version) && GetFixed32(&in, &m.push_window_bytes),
               kCorrupt, "SUBSCRIBE truncated at the served version");
  TERN_REQUIRE(m.push_window_bytes <= kMaxPushWindowBytes, kCorrupt, "SUBSCRIBE: push window of ",
               m.push_window_bytes, " bytes (at most ", kMaxPushWindowBytes, ")");
  return m;
}

std::string EncodeOffer(const Offer& m) {
  TERN_ASSERT(!m.signed_manifest.empty() && m.signed_manifest.size() <= kMaxSignedManifestBytes);
  TERN_ASSERT(m.object_index < kMaxManifestObjects);
  std::string out = Header(DataType::kOffer);
  PutFixed32(&out, m.object_index);
  PutFixed32(&out, static_cast<uint32_t>(m.signed_manifest.size()));
  out += m.signed_manifest;
  return out;
}

Result<Offer> DecodeOffer(std::string_view in) {
  TERN_RETURN_IF_ERROR(TakeHeader(&in, DataType::kOffer));
  Offer m;
  uint32_t manifest_bytes = 0;
  TERN_REQUIRE(GetFixed32(&in, &m.object_index) && GetFixed32(&in, &manifest_bytes), kCorrupt,
               "OFFER truncated");
  TERN_REQUIRE(m.object_index < kMaxManifestObjects, kCorrupt, "OFFER: object index ",
               m.object_index, " (a manifest lists at most ", kMaxManifestObjects, ")");
  TERN_REQUIRE(manifest_bytes >= 1 && manifest_bytes <= kMaxSignedManifestBytes &&
                   manifest_bytes == in.size(),
               kCorrupt, "OFFER: signed manifest of ", manifest_bytes, " bytes with ", in.size(),
               " left (1..", kMaxSignedManifestBytes, ")");
  m.signed_manifest.assign(in);
  return m;
}

std::string EncodeHashes(const Hashes& m) {
  TERN_ASSERT(!m.hashes.empty() && m.hashes.size() <= kMaxHashesPerMessage);
  TERN_ASSERT(uint64_t{m.first} + m.hashes.size() <= kMaxManifestChunks);
  std::string out = Header(DataType::kHashes);
  PutRef(&out, m.object);
  PutFixed32(&out, m.first);
  PutFixed32(&out, static_cast<uint32_t>(m.hashes.size()));
  for (const Sha256Hash& h : m.hashes) out.append(reinterpret_cast<const char*>(h.data()), h.size());
  return out;
}

Result<Hashes> DecodeHashes(std::string_view in) {
  TERN_RETURN_IF_ERROR(TakeHeader(&in, DataType::kHashes));
  Hashes m;
  TERN_ASSIGN_OR_RETURN(m.object, TakeRef(&in));
  uint32_t count = 0;
  TERN_REQUIRE(GetFixed32(&in, &m.first) && GetFixed32(&in, &count), kCorrupt, "HASHES truncated");
  TERN_REQUIRE(count >= 1 && count <= kMaxHashesPerMessage, kCorrupt, "HASHES: ", count,
               " hashes (1..", kMaxHashesPerMessage, ")");
  TERN_REQUIRE(uint64_t{m.first} + count <= kMaxManifestChunks, kCorrupt, "HASHES: hashes ",
               m.first, "+", count, " past ", kMaxManifestChunks, " chunks");
  TERN_REQUIRE(in.size() == uint64_t{count} * 32, kCorrupt, "HASHES: ", in.size(),
               " bytes for ", count, " hashes");
  m.hashes.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    std::memcpy(m.hashes[i].data(), in.data() + size_t{i} * 32, 32);
  }
  return m;
}

std::string EncodeWant(const Want& m) {
  TERN_ASSERT(!m.chunks.empty() && m.chunks.size() <= kMaxWantChunks);
  TERN_ASSERT(m.window_base <= kMaxWindowBase);
  std::string out = Header(DataType::kWant);
  PutRef(&out, m.object);
  PutFixed64(&out, m.window_base);
  PutFixed32(&out, static_cast<uint32_t>(m.chunks.size()));
  PutFixed32(&out, 0);
  for (size_t i = 0; i < m.chunks.size(); ++i) {
    TERN_ASSERT(m.chunks[i] < kMaxManifestChunks && (i == 0 || m.chunks[i - 1] < m.chunks[i]));
    PutFixed32(&out, m.chunks[i]);
  }
  return out;
}

Result<Want> DecodeWant(std::string_view in) {
  TERN_RETURN_IF_ERROR(TakeHeader(&in, DataType::kWant));
  Want m;
  TERN_ASSIGN_OR_RETURN(m.object, TakeRef(&in));
  uint32_t count = 0, reserved = 0;
  TERN_REQUIRE(GetFixed64(&in, &m.window_base) && GetFixed32(&in, &count) &&
                   GetFixed32(&in, &reserved),
               kCorrupt, "WANT truncated");
  TERN_REQUIRE(reserved == 0, kCorrupt, "WANT: reserved field not zero");
  TERN_REQUIRE(m.window_base <= kMaxWindowBase, kCorrupt, "WANT: window base ", m.window_base,
               " leaves no room for the object's windows");
  TERN_REQUIRE(count >= 1 && count <= kMaxWantChunks, kCorrupt, "WANT: ", count, " chunks (1..",
               kMaxWantChunks, ")");
  TERN_REQUIRE(in.size() == uint64_t{count} * 4, kCorrupt, "WANT: ", in.size(), " bytes for ",
               count, " chunk indices");
  m.chunks.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    m.chunks[i] = static_cast<uint32_t>(DecodeFixedAt(in, size_t{i} * 4, 4));
    TERN_REQUIRE(m.chunks[i] < kMaxManifestChunks, kCorrupt, "WANT: chunk ", m.chunks[i],
                 " past ", kMaxManifestChunks);
    TERN_REQUIRE(i == 0 || m.chunks[i - 1] < m.chunks[i], kCorrupt,
                 "WANT: chunk indices not strictly increasing");
  }
  return m;
}

std::string EncodeFetch(const ObjectRef& m) {
  std::string out = Header(DataType::kFetch);
  PutRef(&out, m);
  return out;
}

Result<ObjectRef> DecodeFetch(std::string_view in) {
  TERN_RETURN_IF_ERROR(TakeHeader(&in, DataType::kFetch));
  TERN_ASSIGN_OR_RETURN(ObjectRef ref, TakeRef(&in));
  TERN_RETURN_IF_ERROR(RequireEnd(in, "FETCH"));
  return ref;
}

std::string EncodePush(const Push& m) {
  TERN_ASSERT(m.count >= 1 && m.count <= kMaxWantChunks);
  std::string out = Header(DataType::kPush);
  PutRef(&out, m.object);
  PutFixed32(&out, m.count);
  PutFixed32(&out, 0);
  return out;
}

Result<Push> DecodePush(std::string_view in) {
  TERN_RETURN_IF_ERROR(TakeHeader(&in, DataType::kPush));
  Push m;
  TERN_ASSIGN_OR_RETURN(m.object, TakeRef(&in));
  uint32_t reserved = 0;
  TERN_REQUIRE(GetFixed32(&in, &m.count) && GetFixed32(&in, &reserved), kCorrupt, "PUSH truncated");
  TERN_REQUIRE(reserved == 0, kCorrupt, "PUSH: reserved field not zero");
  TERN_REQUIRE(m.count >= 1 && m.count <= kMaxWantChunks, kCorrupt, "PUSH: ", m.count,
               " chunks (1..", kMaxWantChunks, ")");
  TERN_RETURN_IF_ERROR(RequireEnd(in, "PUSH"));
  return m;
}

std::string EncodePushDone(const ObjectRef& m) {
  std::string out = Header(DataType::kPushDone);
  PutRef(&out, m);
  return out;
}

Result<ObjectRef> DecodePushDone(std::string_view in) {
  TERN_RETURN_IF_ERROR(TakeHeader(&in, DataType::kPushDone));
  TERN_ASSIGN_OR_RETURN(ObjectRef ref, TakeRef(&in));
  TERN_RETURN_IF_ERROR(RequireEnd(in, "PUSH_DONE"));
  return ref;
}

std::string EncodeGone(const Gone& m) {
  TERN_ASSERT(m.code != Code::kOk);
  const std::string_view reason =
      std::string_view(m.reason).substr(0, std::min<size_t>(m.reason.size(), kMaxReasonBytes));
  std::string out = Header(DataType::kGone);
  PutRef(&out, m.object);
  PutFixed16(&out, static_cast<uint16_t>(m.code));
  PutFixed16(&out, 0);
  PutFixed32(&out, static_cast<uint32_t>(reason.size()));
  out += reason;
  return out;
}

Result<Gone> DecodeGone(std::string_view in) {
  TERN_RETURN_IF_ERROR(TakeHeader(&in, DataType::kGone));
  Gone m;
  TERN_ASSIGN_OR_RETURN(m.object, TakeRef(&in));
  uint16_t code = 0, reserved = 0;
  uint32_t reason_bytes = 0;
  TERN_REQUIRE(GetFixed16(&in, &code) && GetFixed16(&in, &reserved) &&
                   GetFixed32(&in, &reason_bytes),
               kCorrupt, "GONE truncated");
  TERN_REQUIRE(code != 0, kCorrupt, "GONE: status code 0 (ok) is not a reason");
  TERN_REQUIRE(reserved == 0, kCorrupt, "GONE: reserved field not zero");
  TERN_REQUIRE(reason_bytes <= kMaxReasonBytes && reason_bytes == in.size(), kCorrupt,
               "GONE: reason of ", reason_bytes, " bytes with ", in.size(), " left (at most ",
               kMaxReasonBytes, ")");
  m.code = static_cast<Code>(code);
  m.reason.assign(in);
  return m;
}

}  // namespace tern::agent
