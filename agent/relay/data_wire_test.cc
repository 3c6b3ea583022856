// The data-plane codec: round trips, the byte layout of docs/format/agent.md
// §7, and refusal of every malformed shape (truncation, trailing bytes,
// reserved bits, counts past their bounds).
#include "agent/relay/data_wire.h"

#include <gtest/gtest.h>

#include "base/coding.h"

namespace tern::agent {
namespace {

const ObjectRef kPatch34{ObjectKind::kPatch, 3, 4};
const ObjectRef kPatch12{ObjectKind::kPatch, 1, 2};

std::vector<std::string> Samples() {
  Hashes h{kPatch34, 5, {}};
  h.hashes.resize(3);
  for (size_t i = 0; i < h.hashes.size(); ++i) h.hashes[i].fill(static_cast<uint8_t>(i + 1));
  return {
      EncodeSubscribe({"member-a", 1, 3, "", 9}),
      EncodeOffer({2, std::string(300, 'm')}),
      EncodeHashes(h),
      EncodeWant({kPatch34, 4097, {0, 2, 9}}),
      EncodeFetch({ObjectKind::kKeyframe, 7, 7}),
      EncodeGone({kPatch34, Code::kNotFound, "not held here"}),
      EncodePush({kPatch34, 2}),
      EncodePushDone(kPatch34),
  };
}

// Decodes `in` as the message its type byte says; the status only.
Status DecodeAny(std::string_view in) {
  switch (static_cast<DataType>(DataTypeOf(in))) {
    case DataType::kSubscribe: return DecodeSubscribe(in).status();
    case DataType::kOffer: return DecodeOffer(in).status();
    case DataType::kHashes: return DecodeHashes(in).status();
    case DataType::kWant: return DecodeWant(in).status();
    case DataType::kFetch: return DecodeFetch(in).status();
    case DataType::kGone: return DecodeGone(in).status();
    case DataType::kPush: return DecodePush(in).status();
    case DataType::kPushDone: return DecodePushDone(in).status();
  }
  return TERN_ERROR(kCorrupt, "unknown type");
}

TEST(DataWire, RoundTrips) {
  auto t = DecodeSubscribe(EncodeSubscribe({"member-a", 1, 3, "tok", 0x0102030405060708, 4096}));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->member_id, "member-a");
  EXPECT_EQ(t->token, "tok");
  EXPECT_EQ(t->served_version, 0x0102030405060708u);
  EXPECT_EQ(t->push_window_bytes, 4096u);
  auto p = DecodePush(EncodePush({kPatch34, 7}));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->object, kPatch34);
  EXPECT_EQ(p->count, 7u);
  auto pd = DecodePushDone(EncodePushDone(kPatch34));
  ASSERT_TRUE(pd.ok());
  EXPECT_EQ(*pd, kPatch34);
  std::string big = EncodeSubscribe({"m", 0, 1, "", 0, 0});
  std::string field;
  PutFixed32(&field, kMaxPushWindowBytes + 1);
  big.replace(big.size() - 4, 4, field);
  EXPECT_FALSE(DecodeSubscribe(big).ok());
  std::string zero = EncodePush({kPatch34, 1});
  zero.replace(28, 4, std::string(4, '\0'));
  EXPECT_FALSE(DecodePush(zero).ok());
  auto s = DecodeSubscribe(EncodeSubscribe({"member-a", 1, 3, ""}));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->member_id, "member-a");
  EXPECT_EQ(s->stripe, 1);
  EXPECT_EQ(s->stripes, 3);

  auto w = DecodeWant(EncodeWant({kPatch34, 4097, {0, 2, 9}}));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->object, kPatch34);
  EXPECT_EQ(w->window_base, 4097u);
  EXPECT_EQ(w->chunks, (std::vector<uint32_t>{0, 2, 9}));

  auto g = DecodeGone(EncodeGone({kPatch34, Code::kNotFound, std::string(5000, 'x')}));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->code, Code::kNotFound);
  EXPECT_EQ(g->reason.size(), kMaxReasonBytes);  // cut, not refused

  for (const std::string& m : Samples()) EXPECT_TRUE(DecodeAny(m).ok()) << int(m[0]);
}

TEST(DataWire, LayoutOfWant) {
  // docs/format/agent.md §7.2: header, object ref (24), base u64, count u32, reserved u32, u32s.
  const std::string m = EncodeWant({kPatch34, 0x0102030405060708, {7}});
  ASSERT_EQ(m.size(), 4u + 24 + 8 + 4 + 4 + 4);
  EXPECT_EQ(uint8_t(m[0]), 0x43);
  EXPECT_EQ(uint8_t(m[4]), 1);  // kind patch
  EXPECT_EQ(DecodeFixedAt(m, 12, 8), 3u);
  EXPECT_EQ(DecodeFixedAt(m, 20, 8), 4u);
  EXPECT_EQ(DecodeFixedAt(m, 28, 8), 0x0102030405060708u);
  EXPECT_EQ(DecodeFixedAt(m, 36, 4), 1u);
  EXPECT_EQ(DecodeFixedAt(m, 44, 4), 7u);
}

std::string Hex(std::string_view b) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

// The spec's example (docs/format/agent.md §7.3).
TEST(DataWire, GoldenWant) {
  EXPECT_EQ(Hex(EncodeWant({kPatch12, 4097, {0, 2}})),
            "43000000"
            "0100000000000000"
            "0100000000000000"
            "0200000000000000"
            "0110000000000000"
            "02000000"
            "00000000"
            "0000000002000000");
}

// The spec's SUBSCRIBE example (docs/format/agent.md §7.3): the served
// version is the last field, after the token.
TEST(DataWire, GoldenSubscribe) {
  EXPECT_EQ(Hex(EncodeSubscribe({"m1", 1, 2, "t", 7, 65536})),
            "40000000"
            "0100"
            "0200"
            "02000000"
            "6d31"
            "01000000"
            "74"
            "0700000000000000"
            "00000100");
}

TEST(DataWire, EveryTruncationAndTrailingByteIsRefused) {
  for (const std::string& m : Samples()) {
    for (size_t n = 0; n < m.size(); ++n) {
      EXPECT_FALSE(DecodeAny(m.substr(0, n)).ok()) << int(m[0]) << " cut to " << n;
    }
    EXPECT_FALSE(DecodeAny(m + '\0').ok()) << int(m[0]) << " with a trailing byte";
  }
}

TEST(DataWire, ReservedBytesMustBeZero) {
  for (const std::string& m : Samples()) {
    for (size_t at : {1, 2, 3}) {
      std::string bad = m;
      bad[at] = 1;
      EXPECT_EQ(DecodeAny(bad).code(), Code::kCorrupt) << int(m[0]) << " byte " << at;
    }
  }
  // The object reference's reserved bytes (HASHES at offset 4 + 1..7).
  std::string h = Samples()[2];
  h[6] = 1;
  EXPECT_EQ(DecodeHashes(h).status().code(), Code::kCorrupt);
}

TEST(DataWire, BoundsAndOrder) {
  // A type other than the one asked for.
  EXPECT_EQ(DecodeWant(EncodeFetch(kPatch34)).status().code(), Code::kProtocol);
  // Stripes past kMaxStripes, a stripe not below stripes.
  std::string s = EncodeSubscribe({"m", 0, 1, ""});
  EncodeFixed16(reinterpret_cast<uint8_t*>(s.data()) + 6, kMaxStripes + 1);
  EXPECT_FALSE(DecodeSubscribe(s).ok());
  s = EncodeSubscribe({"m", 0, 2, ""});
  EncodeFixed16(reinterpret_cast<uint8_t*>(s.data()) + 4, 2);
  EXPECT_FALSE(DecodeSubscribe(s).ok());
  // Chunk indices repeated or descending.
  std::string w = EncodeWant({kPatch34, 1, {3, 4}});
  EncodeFixed32(reinterpret_cast<uint8_t*>(w.data()) + 48, 3);
  EXPECT_FALSE(DecodeWant(w).ok());
  // A count past kMaxWantChunks with a length to match.
  w = EncodeWant({kPatch34, 1, {0}});
  EncodeFixed32(reinterpret_cast<uint8_t*>(w.data()) + 36, kMaxWantChunks + 1);
  w.resize(44);
  for (uint32_t i = 0; i <= kMaxWantChunks; ++i) PutFixed32(&w, i);
  EXPECT_FALSE(DecodeWant(w).ok());
  // A window base that leaves no room for the object's windows.
  w = EncodeWant({kPatch34, 1, {0}});
  EncodeFixed64(reinterpret_cast<uint8_t*>(w.data()) + 28, kMaxWindowBase + 1);
  EXPECT_FALSE(DecodeWant(w).ok());
  // Hashes past kMaxManifestChunks.
  std::string h = Samples()[2];
  EncodeFixed32(reinterpret_cast<uint8_t*>(h.data()) + 28, kMaxManifestChunks - 1);
  EXPECT_FALSE(DecodeHashes(h).ok());
  // Object references that do not fit their kind.
  EXPECT_FALSE(ValidateObjectRef({ObjectKind::kPatch, 4, 4}).ok());
  // A supersede's patch runs backwards (docs/agent/board.md §4a): the
  // reference fits; its signed manifest says whether it is one.
  EXPECT_TRUE(ValidateObjectRef({ObjectKind::kPatch, 1000000, 3}).ok());
  EXPECT_TRUE(ValidateObjectRef({ObjectKind::kSquash, 9, 5}).ok());
  EXPECT_FALSE(ValidateObjectRef({ObjectKind::kKeyframe, 3, 4}).ok());
  EXPECT_FALSE(ValidateObjectRef({static_cast<ObjectKind>(9), 3, 4}).ok());
  std::string f = EncodeFetch(kPatch34);
  f[4] = 9;
  EXPECT_FALSE(DecodeFetch(f).ok());
  // An OFFER index past the manifest bound; a manifest too big to be one.
  std::string o = EncodeOffer({0, "m"});
  EncodeFixed32(reinterpret_cast<uint8_t*>(o.data()) + 4, kMaxManifestObjects);
  EXPECT_FALSE(DecodeOffer(o).ok());
  EXPECT_FALSE(DecodeOffer(EncodeOffer({0, "m"}) + std::string(kMaxSignedManifestBytes, 'm')).ok());
  // GONE with code 0.
  std::string g = EncodeGone({kPatch34, Code::kNotFound, ""});
  EncodeFixed16(reinterpret_cast<uint8_t*>(g.data()) + 28, 0);
  EXPECT_FALSE(DecodeGone(g).ok());
}

TEST(DataWire, ObjectFileNames) {
  EXPECT_EQ(ObjectName(kPatch34), "patch-3-4");
  EXPECT_EQ(ObjectName({ObjectKind::kKeyframe, 9, 9}), "keyframe-9-9");
  EXPECT_EQ(ObjectName({ObjectKind::kSquash, 2, 9}), "squash-2-9");
}

}  // namespace
}  // namespace tern::agent
