#include "agent/control/control_wire.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <limits>

namespace tern::agent {
namespace {

std::vector<ControlMessage> Samples() {
  Hello hello;
  hello.member = {"m-1",           "eu",    "c1", "i1",   "127.0.0.1:7001",
                  "10.0.0.1:7101", "verbs", true, 1.25e9, 2.5e9, true};
  hello.board_id[0] = 7;
  hello.served_version = 42;
  hello.join_token = "secret";
  Welcome welcome{hello.board_id, 43, 1000, 2, 10000, "127.0.0.1:7009"};
  Heartbeat hb{9,     42,    43,    1000, 2000, 3, 0.05, 1e8, 0.012, 0.075, {{0.05, 1e8}, {0.01, 0}},
               2.5e9, 6.5e8, 0x1122334455667788ull};
  Parents parents{5, {{0, "root", "127.0.0.1:7000", false}, {1, "m-2", "10.0.0.2:7102", true}}};
  Head head{43, std::string(200, 'm')};
  CatchUpRequest req{40, 43};
  CatchUpReply plan{43, {"a", "bb"}, {{ObjectKind::kKeyframe, 32, 32}, {ObjectKind::kSquash, 32, 43}}};
  ParentReport report{1, "m-2", ParentFault::kBadChunks};
  Beacon beacon{std::string(140, 'b')};
  KeySets key_sets{{std::string(152, 'k'), std::string(192, 'l')}};
  return {hello, welcome, Reject{"bad token"},         hb,       parents, head,  req,
          plan,  Leave{}, Ping{0x0102030405060708ull}, Pong{77}, report,  beacon, key_sets};
}

TEST(ControlWire, RoundTripsEveryType) {
  for (const auto& m : Samples()) {
    auto bytes = EncodeControl(m);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    EXPECT_EQ(static_cast<uint8_t>((*bytes)[0]), static_cast<uint8_t>(TypeOf(m)));
    auto back = DecodeControl(*bytes);
    ASSERT_TRUE(back.ok()) << ControlTypeName(TypeOf(m)) << ": " << back.status().ToString();
    EXPECT_TRUE(*back == m) << ControlTypeName(TypeOf(m));
  }
}

TEST(ControlWire, EveryTruncationAndTrailingByteIsCorrupt) {
  for (const auto& m : Samples()) {
    const std::string bytes = *EncodeControl(m);
    for (size_t n = 0; n < bytes.size(); ++n) {
      auto r = DecodeControl(std::string_view(bytes).substr(0, n));
      EXPECT_EQ(r.status().code(), Code::kCorrupt) << ControlTypeName(TypeOf(m)) << " cut at " << n;
    }
    auto r = DecodeControl(bytes + '\0');
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << ControlTypeName(TypeOf(m));
  }
}

TEST(ControlWire, BeaconIsBounded) {
  EXPECT_EQ(EncodeControl(Beacon{}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(Beacon{std::string(kMaxSignedBeaconBytes + 1, 'b')}).status().code(),
            Code::kInvalidArgument);
  ASSERT_TRUE(EncodeControl(Beacon{std::string(kMaxSignedBeaconBytes, 'b')}).ok());
  // A length past the bound is refused before anything is read.
  std::string big = *EncodeControl(Beacon{std::string(kMaxSignedBeaconBytes, 'b')});
  const uint32_t n = kMaxSignedBeaconBytes + 1;
  std::memcpy(&big[4], &n, 4);
  big.push_back('b');
  EXPECT_EQ(DecodeControl(big).status().code(), Code::kCorrupt);
}

TEST(ControlWire, KeySetsAreBounded) {
  EXPECT_EQ(EncodeControl(KeySets{}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(KeySets{{""}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(KeySets{{std::string(kMaxSignedKeySetBytes + 1, 'k')}}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(KeySets{std::vector<std::string>(kMaxControlKeySets + 1, "k")})
                .status()
                .code(),
            Code::kInvalidArgument);
  ASSERT_TRUE(EncodeControl(KeySets{std::vector<std::string>(kMaxControlKeySets, "k")}).ok());
  // A count or a length past its bound is refused before anything is read.
  std::string many = *EncodeControl(KeySets{{"k"}});
  const uint32_t count = kMaxControlKeySets + 1;
  std::memcpy(&many[4], &count, 4);
  EXPECT_EQ(DecodeControl(many).status().code(), Code::kCorrupt);
  std::string big = *EncodeControl(KeySets{{std::string(kMaxSignedKeySetBytes, 'k')}});
  const uint32_t n = kMaxSignedKeySetBytes + 1;
  std::memcpy(&big[8], &n, 4);
  big.push_back('k');
  EXPECT_EQ(DecodeControl(big).status().code(), Code::kCorrupt);
}

TEST(ControlWire, RefusesUnknownTypeReservedBytesAndBadFields) {
  EXPECT_EQ(DecodeControl(std::string("\x3f\0\0\0", 4)).status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeControl(std::string("\x09\1\0\0", 4)).status().code(), Code::kCorrupt);
  EXPECT_TRUE(DecodeControl(std::string("\x09\0\0\0", 4)).ok());  // LEAVE

  // A NaN rate in a heartbeat.
  std::string hb = *EncodeControl(Heartbeat{});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::memcpy(hb.data() + 4 + 6 * 8, &nan, 8);
  EXPECT_EQ(DecodeControl(hb).status().code(), Code::kCorrupt);

  // The round trip to the root is a rate-like field too (before the count,
  // the two apply rates and the wire bytes).
  std::string hb_rtt = *EncodeControl(Heartbeat{});
  std::memcpy(hb_rtt.data() + hb_rtt.size() - 36, &nan, 8);
  EXPECT_EQ(DecodeControl(hb_rtt).status().code(), Code::kCorrupt);
  // So are the apply rates per format (the 16 bytes before the wire bytes).
  for (size_t back : {24, 16}) {
    std::string hb_apply = *EncodeControl(Heartbeat{});
    std::memcpy(hb_apply.data() + hb_apply.size() - back, &nan, 8);
    EXPECT_EQ(DecodeControl(hb_apply).status().code(), Code::kCorrupt) << back;
  }
  EXPECT_EQ(DecodeControl(hb_rtt).status().code(), Code::kCorrupt);
  // Per-parent figures: a negative rate, a count above 8 stripes.
  Heartbeat with_parents;
  with_parents.parents = {{0.01, 5}};
  std::string hb_parent = *EncodeControl(with_parents);
  const double negative = -1;
  std::memcpy(hb_parent.data() + hb_parent.size() - 32, &negative, 8);
  EXPECT_EQ(DecodeControl(hb_parent).status().code(), Code::kCorrupt);
  std::string hb_count = *EncodeControl(Heartbeat{});
  const uint32_t nine = 9;
  std::memcpy(hb_count.data() + hb_count.size() - 28, &nine, 4);
  EXPECT_EQ(DecodeControl(hb_count).status().code(), Code::kCorrupt);

  // A parent report with an unknown fault, or a stripe past the last.
  std::string report = *EncodeControl(ParentReport{0, "p", ParentFault::kStalled});
  report.back() = 3;
  EXPECT_EQ(DecodeControl(report).status().code(), Code::kCorrupt);
  report.back() = 0;
  EXPECT_EQ(DecodeControl(report).status().code(), Code::kCorrupt);
  report = *EncodeControl(ParentReport{0, "p", ParentFault::kStalled});
  report[4] = 8;
  EXPECT_EQ(DecodeControl(report).status().code(), Code::kCorrupt);

  // A string length past its bound, without the bytes behind it.
  std::string reject = *EncodeControl(Reject{"x"});
  const uint32_t huge = 0xFFFFFFFFu;
  std::memcpy(reject.data() + 4, &huge, 4);
  EXPECT_EQ(DecodeControl(reject).status().code(), Code::kCorrupt);

  // Another protocol version.
  std::string hello = *EncodeControl(Samples()[0]);
  hello[4] = 8;  // the protocol before HEARTBEAT carried the wire bytes
  auto r = DecodeControl(hello);
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find("control protocol 8 (this agent speaks 9;"),
            std::string::npos)
      << r.status().message();
}

// HELLO names the intra-cluster backend next to its address: both or
// neither, so the root never plans an intra edge to a member that gave an
// address but no backend to compare (or the reverse).
TEST(ControlWire, IntraAddressAndBackendComeTogether) {
  Hello h = std::get<Hello>(Samples()[0]);
  const std::string with_both = *EncodeControl(h);
  Hello neither = h;
  neither.member.intra_address.clear();
  neither.member.intra_backend.clear();
  auto plain = EncodeControl(neither);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_TRUE(DecodeControl(*plain).ok());
  EXPECT_EQ(std::get<Hello>(*DecodeControl(*plain)).member.intra_backend, "");

  Hello address_only = h;
  address_only.member.intra_backend.clear();
  EXPECT_EQ(EncodeControl(address_only).status().code(), Code::kInvalidArgument);
  Hello backend_only = h;
  backend_only.member.intra_address.clear();
  EXPECT_EQ(EncodeControl(backend_only).status().code(), Code::kInvalidArgument);

  // The same on the wire: blank the backend's length (and drop its bytes).
  const size_t at = with_both.find("verbs");
  ASSERT_NE(at, std::string::npos);
  std::string forged =
      with_both.substr(0, at - 4) + std::string(4, '\0') + with_both.substr(at + 5);
  auto r = DecodeControl(forged);
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find("give both or neither"), std::string::npos)
      << r.status().message();
  // A backend name past the id bound.
  Hello long_name = h;
  long_name.member.intra_backend = std::string(kMaxControlIdBytes + 1, 'v');
  EXPECT_EQ(EncodeControl(long_name).status().code(), Code::kInvalidArgument);
}

// A member holding a checkpoint of version 5 asks for version 5's manifest
// alone (target == have); the answer carries manifests and no object.
TEST(ControlWire, ManifestOnlyCatchUpRoundTrips) {
  for (const ControlMessage& m : {ControlMessage{CatchUpRequest{5, 5}},
                                  ControlMessage{CatchUpReply{5, {"signed"}, {}}}}) {
    auto bytes = EncodeControl(m);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto back = DecodeControl(*bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, m);
  }
}

TEST(ControlWire, EncodeRefusesWhatDecodeWouldRefuse) {
  Hello h;  // empty member id
  EXPECT_EQ(EncodeControl(h).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(CatchUpRequest{5, 0}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(CatchUpRequest{0, 0}).status().code(), Code::kInvalidArgument);
  // A target numbered below have: after a supersede (docs/agent/board.md
  // §4a) the root orders them by position.
  EXPECT_TRUE(EncodeControl(CatchUpRequest{1000000, 4}).ok());
  EXPECT_EQ(EncodeControl(CatchUpReply{5, {}, {}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(Parents{}).status().code(), Code::kInvalidArgument);
  Heartbeat hb;
  hb.rtt_to_parent_s = -1;
  EXPECT_EQ(EncodeControl(hb).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(Welcome{{}, 1, 0, 1, 0, ""}).status().code(), Code::kInvalidArgument);
  hb.rtt_to_parent_s = 0;
  hb.rtt_to_root_s = std::numeric_limits<double>::infinity();
  EXPECT_EQ(EncodeControl(hb).status().code(), Code::kInvalidArgument);
  hb.rtt_to_root_s = 0;
  hb.apply_f2_bytes_per_s = -1;
  EXPECT_EQ(EncodeControl(hb).status().code(), Code::kInvalidArgument);
  hb.apply_f2_bytes_per_s = 0;
  hb.parents.assign(9, ParentFigures{});
  EXPECT_EQ(EncodeControl(hb).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(ParentReport{8, "p", ParentFault::kStalled}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(ParentReport{0, "", ParentFault::kStalled}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(EncodeControl(ParentReport{0, "p", static_cast<ParentFault>(9)}).status().code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace tern::agent
