// The verbs backend's device-free pieces: the dlopen loader and probe, the
// side-channel endpoint codec, immediates and chunk slots, control headers,
// message reassembly, QP transitions and the link state machine. Tests that
// need an RDMA device skip with the probe's reason.
#include <gtest/gtest.h>

#include <cstring>

#include "tern/transport.h"
#include "tern/transport_probe.h"
#include "transport/verbs/ibv_api.h"
#include "transport/verbs/probe.h"
#include "transport/verbs/qp.h"
#include "transport/verbs/wire.h"

namespace tern::verbs {
namespace {

TEST(VerbsLoader, MissingLibraryFailsCleanly) {
  auto api = IbvApi::Load("libtern-no-such-ibverbs.so.1");
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), Code::kUnavailable);
  EXPECT_NE(api.status().message().find("libtern-no-such-ibverbs.so.1"), std::string::npos);
  BackendProbe probe = ProbeVerbsLibrary("libtern-no-such-ibverbs.so.1");
  EXPECT_FALSE(probe.available);
  EXPECT_NE(probe.detail.find("cannot load"), std::string::npos) << probe.detail;
}

TEST(VerbsLoader, LibraryWithoutVerbsSymbolsFailsCleanly) {
  // libc loads but is not libibverbs: the first missing symbol is named.
  auto api = IbvApi::Load("libc.so.6");
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), Code::kUnavailable);
  EXPECT_NE(api.status().message().find("lacks ibv_get_device_list"), std::string::npos)
      << api.status().ToString();
}

TEST(VerbsLoader, RealLibraryListsPortsOrSkips) {
  auto api = IbvApi::Load();
  if (!api.ok()) GTEST_SKIP() << "no libibverbs here: " << api.status().message();
  auto ports = ListPorts(**api);
  ASSERT_TRUE(ports.ok()) << ports.status().ToString();
  BackendProbe probe = ProbeVerbs();
  EXPECT_NE(probe.detail.find("libibverbs.so.1 loaded"), std::string::npos) << probe.detail;
  if (ports->empty()) {
    EXPECT_NE(probe.detail.find("0 devices"), std::string::npos) << probe.detail;
    GTEST_SKIP() << "no RDMA device: " << probe.detail;
  }
  for (const PortInfo& p : *ports) {
    EXPECT_FALSE(p.device.empty());
    EXPECT_GE(p.port, 1);
    if (p.active) {
      EXPECT_NE(p.active_mtu_bytes, 0u) << p.device;
    }
  }
}

TEST(VerbsWire, EndpointRoundTrip) {
  QpEndpoint ep;
  ep.qpn = 0x123456;
  ep.psn = 0xabcdef;
  ep.lid = 0;
  ep.mtu_bytes = 1024;
  ep.port = 2;
  ep.gid_index = 3;
  ep.ethernet = true;
  for (int i = 0; i < 16; ++i) ep.gid[i] = static_cast<uint8_t>(i * 17);
  ep.credits = 512;
  ep.rd_atomic = 16;
  const std::string bytes = EncodeEndpoint(ep);
  ASSERT_EQ(bytes.size(), kEndpointBytes);
  QpEndpoint out;
  ASSERT_TRUE(DecodeEndpoint(bytes, &out).ok());
  EXPECT_EQ(out.qpn, ep.qpn);
  EXPECT_EQ(out.psn, ep.psn);
  EXPECT_EQ(out.mtu_bytes, 1024u);
  EXPECT_EQ(out.port, 2);
  EXPECT_EQ(out.gid_index, 3);
  EXPECT_TRUE(out.ethernet);
  EXPECT_EQ(std::memcmp(out.gid, ep.gid, 16), 0);
  EXPECT_EQ(out.credits, 512u);
  EXPECT_EQ(out.rd_atomic, 16);
}

TEST(VerbsWire, EndpointRejectsWhatAPeerCanGetWrong) {
  QpEndpoint good;
  good.qpn = 7;
  good.lid = 3;
  good.credits = kMinCredits;
  QpEndpoint out;
  ASSERT_TRUE(DecodeEndpoint(EncodeEndpoint(good), &out).ok());
  auto bad = [&](auto mutate) {
    QpEndpoint e = good;
    mutate(e);
    return DecodeEndpoint(EncodeEndpoint(e), &out).code();
  };
  EXPECT_EQ(bad([](QpEndpoint& e) { e.qpn = 0; }), Code::kProtocol);
  EXPECT_EQ(bad([](QpEndpoint& e) { e.qpn = 1u << 24; }), Code::kProtocol);
  EXPECT_EQ(bad([](QpEndpoint& e) { e.psn = 1u << 24; }), Code::kProtocol);
  EXPECT_EQ(bad([](QpEndpoint& e) { e.mtu_bytes = 1500; }), Code::kProtocol);
  EXPECT_EQ(bad([](QpEndpoint& e) { e.port = 0; }), Code::kProtocol);
  EXPECT_EQ(bad([](QpEndpoint& e) { e.credits = kMinCredits - 1; }), Code::kProtocol);
  EXPECT_EQ(bad([](QpEndpoint& e) { e.rd_atomic = 0; }), Code::kProtocol);
  EXPECT_EQ(bad([](QpEndpoint& e) { e.credits = kMaxCredits + 1; }), Code::kProtocol);
  EXPECT_EQ(bad([](QpEndpoint& e) { e.lid = 0; }), Code::kProtocol);  // IB needs a LID
  std::string bytes = EncodeEndpoint(good);
  EXPECT_EQ(DecodeEndpoint(bytes.substr(1), &out).code(), Code::kProtocol);
  std::string version = bytes;
  version[4] = 2;
  Status st = DecodeEndpoint(version, &out);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_NE(st.message().find("v2"), std::string::npos);
  std::string reserved = bytes;
  reserved[45] = 1;
  EXPECT_EQ(DecodeEndpoint(reserved, &out).code(), Code::kProtocol);
  reserved = bytes;
  reserved[23] = 1;
  EXPECT_EQ(DecodeEndpoint(reserved, &out).code(), Code::kProtocol);
  std::string flags = bytes;
  flags[6] = 2;
  EXPECT_EQ(DecodeEndpoint(flags, &out).code(), Code::kProtocol);
}

TEST(VerbsWire, ControlHeaderRoundTripAndBounds) {
  ControlHeader chunk;
  chunk.type = ControlType::kChunk;
  chunk.credits = 17;
  chunk.rkey = 0xdeadbeef;
  chunk.a[0] = 1;
  chunk.a[1] = 2;
  chunk.a[2] = 3;
  chunk.a[3] = 4096;
  chunk.a[4] = 0x1122334455667788ull;
  chunk.a[5] = 0x7f0000001000ull;
  ControlHeader out;
  const std::string bytes = EncodeControl(chunk);
  ASSERT_EQ(bytes.size(), kControlBytes);
  ASSERT_TRUE(DecodeControl(bytes, &out).ok());
  EXPECT_EQ(out.type, ControlType::kChunk);
  EXPECT_EQ(out.credits, 17);
  EXPECT_EQ(out.rkey, 0xdeadbeefu);
  EXPECT_EQ(out.a[4], chunk.a[4]);
  EXPECT_EQ(out.a[5], chunk.a[5]);

  auto code = [&](ControlHeader h) { return DecodeControl(EncodeControl(h), &out).code(); };
  ControlHeader c = chunk;
  c.a[3] = 0;
  EXPECT_EQ(code(c), Code::kProtocol);
  c.a[3] = kMaxChunkBytes + 1;
  EXPECT_EQ(code(c), Code::kProtocol);
  c = chunk;
  c.a[5] = ~uint64_t{0} - 10;  // the source range wraps
  EXPECT_EQ(code(c), Code::kProtocol);
  c = chunk;
  c.payload_bytes = 1;  // a chunk announcement carries no payload
  EXPECT_EQ(code(c), Code::kProtocol);
  ControlHeader ack;
  ack.type = ControlType::kAck;
  ack.a[1] = 99;
  EXPECT_EQ(code(ack), Code::kProtocol);
  ack.a[1] = static_cast<uint64_t>(Code::kNotFound);
  ack.payload_bytes = kMaxAckReason + 1;
  EXPECT_EQ(code(ack), Code::kProtocol);
  ack.payload_bytes = 10;
  ack.rkey = 5;  // an rkey only travels with a chunk
  EXPECT_EQ(code(ack), Code::kProtocol);
  ControlHeader credit;
  credit.type = ControlType::kCredit;
  credit.credits = 9;
  EXPECT_TRUE(DecodeControl(EncodeControl(credit), &out).ok());
  credit.a[3] = 1;
  EXPECT_EQ(code(credit), Code::kProtocol);
  ControlHeader bye;
  bye.type = ControlType::kBye;
  bye.payload_bytes = 4;
  EXPECT_EQ(code(bye), Code::kProtocol);
  ControlHeader msg;
  msg.type = ControlType::kMessage;
  msg.a[1] = kMaxMessageBytes + 1;
  EXPECT_EQ(code(msg), Code::kProtocol);
  msg.a[1] = 10;
  msg.a[2] = 8;
  msg.payload_bytes = 3;
  EXPECT_EQ(code(msg), Code::kProtocol);  // fragment past the end
  msg.payload_bytes = kMaxControlPayload + 1;
  EXPECT_EQ(code(msg), Code::kProtocol);
  std::string raw = EncodeControl(chunk);
  raw[0] = 42;
  EXPECT_EQ(DecodeControl(raw, &out).code(), Code::kProtocol);
  raw = EncodeControl(chunk);
  raw[1] = 2;  // another version
  EXPECT_EQ(DecodeControl(raw, &out).code(), Code::kProtocol);
  raw = EncodeControl(chunk);
  raw[13] = 1;  // reserved
  EXPECT_EQ(DecodeControl(raw, &out).code(), Code::kProtocol);
  EXPECT_EQ(DecodeControl(raw.substr(0, 20), &out).code(), Code::kProtocol);
}

TEST(VerbsWire, SideChannelFramesAreBounded) {
  SideKind kind;
  uint32_t length = 0;
  const std::string ep = EncodeSide(SideKind::kEndpoint, std::string(kEndpointBytes, 'e'));
  ASSERT_EQ(ep.size(), kSideHeaderBytes + kEndpointBytes);
  ASSERT_TRUE(DecodeSideHeader(std::string_view(ep).substr(0, kSideHeaderBytes), &kind, &length).ok());
  EXPECT_EQ(kind, SideKind::kEndpoint);
  EXPECT_EQ(length, kEndpointBytes);
  auto header_code = [&](std::string bytes) {
    return DecodeSideHeader(std::string_view(bytes).substr(0, kSideHeaderBytes), &kind, &length).code();
  };
  EXPECT_EQ(header_code(EncodeSide(SideKind::kEndpoint, "short")), Code::kProtocol);
  EXPECT_EQ(header_code(EncodeSide(SideKind::kReady, "x")), Code::kProtocol);
  EXPECT_EQ(header_code(EncodeSide(SideKind::kRefusal, std::string(kMaxSideReason + 1, 'r'))),
            Code::kProtocol);
  EXPECT_EQ(header_code(EncodeSide(SideKind::kRefusal, "busy")), Code::kOk);
  std::string other = EncodeSide(SideKind::kReady, "");
  other[6] = 9;  // unknown kind
  EXPECT_EQ(header_code(other), Code::kProtocol);
  std::string http = "GET / HTTP/1.1\r\n";
  EXPECT_EQ(header_code(http), Code::kProtocol);
  std::string version = EncodeSide(SideKind::kReady, "");
  version[4] = 2;
  Status st = DecodeSideHeader(version, &kind, &length);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_NE(st.message().find("v2"), std::string::npos) << st.ToString();
}

TEST(VerbsWire, RegionKeysRoundTripAndRefuseJunk) {
  RegionKey key{0x1234, 0x7f0000000000ull, 1 << 20};
  RegionKey out;
  const std::string bytes = EncodeRegionKey(key);
  ASSERT_EQ(bytes.size(), kRegionKeyBytes);
  ASSERT_TRUE(DecodeRegionKey(bytes, &out).ok());
  EXPECT_EQ(out.rkey, key.rkey);
  EXPECT_EQ(out.address, key.address);
  EXPECT_EQ(out.size_bytes, key.size_bytes);
  EXPECT_EQ(DecodeRegionKey(bytes.substr(1), &out).code(), Code::kInvalidArgument);
  std::string magic = bytes;
  magic[0] ^= 1;
  EXPECT_EQ(DecodeRegionKey(magic, &out).code(), Code::kInvalidArgument);
  RegionKey wrap{1, ~uint64_t{0} - 5, 100};
  EXPECT_EQ(DecodeRegionKey(EncodeRegionKey(wrap), &out).code(), Code::kInvalidArgument);
}

ControlHeader Fragment(uint64_t seq, uint64_t total, uint64_t offset, size_t size) {
  ControlHeader h;
  h.type = ControlType::kMessage;
  h.a[0] = seq;
  h.a[1] = total;
  h.a[2] = offset;
  h.payload_bytes = static_cast<uint32_t>(size);
  return h;
}

TEST(VerbsWire, MessagesReassembleInOrderOnly) {
  MessageAssembler m;
  auto r = m.Add(Fragment(0, 6, 0, 4), "abcd");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  r = m.Add(Fragment(0, 6, 4, 2), "ef");
  ASSERT_TRUE(r.ok() && *r);
  EXPECT_EQ(m.take(), "abcdef");
  r = m.Add(Fragment(1, 0, 0, 0), "");
  ASSERT_TRUE(r.ok() && *r);  // an empty message is one empty fragment
  EXPECT_EQ(m.take(), "");

  EXPECT_EQ(m.Add(Fragment(5, 4, 0, 2), "ab").status().code(), Code::kProtocol);  // wrong seq
  MessageAssembler gap;
  ASSERT_TRUE(gap.Add(Fragment(0, 6, 0, 2), "ab").ok());
  EXPECT_EQ(gap.Add(Fragment(0, 6, 4, 2), "ef").status().code(), Code::kProtocol);  // hole
  MessageAssembler lying;
  EXPECT_EQ(lying.Add(Fragment(0, 6, 0, 4), "ab").status().code(), Code::kProtocol);
}

TEST(VerbsQp, TransitionsCarryThePeersAddress) {
  QpTransition init = InitTransition(1);
  EXPECT_EQ(init.attr.qp_state, IBV_QPS_INIT);
  EXPECT_TRUE(init.attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
  EXPECT_TRUE(init.attr.qp_access_flags & IBV_ACCESS_REMOTE_READ);  // the peer pulls our chunks
  EXPECT_EQ(init.mask & IBV_QP_ACCESS_FLAGS, IBV_QP_ACCESS_FLAGS);

  QpEndpoint local, remote;
  local.qpn = 10, local.psn = 100, local.lid = 1, local.mtu_bytes = 4096, local.credits = 4;
  remote.qpn = 20, remote.psn = 200, remote.lid = 2, remote.mtu_bytes = 2048, remote.credits = 4;
  auto rtr = ReadyToReceiveTransition(local, remote);
  ASSERT_TRUE(rtr.ok());
  EXPECT_EQ(rtr->attr.dest_qp_num, 20u);
  EXPECT_EQ(rtr->attr.rq_psn, 200u);
  EXPECT_EQ(rtr->attr.path_mtu, IBV_MTU_2048);  // the smaller side wins
  EXPECT_EQ(rtr->attr.ah_attr.dlid, 2);
  EXPECT_EQ(rtr->attr.ah_attr.is_global, 0);

  local.ethernet = remote.ethernet = true;
  remote.gid[15] = 0x42;
  local.gid_index = 3;
  rtr = ReadyToReceiveTransition(local, remote);
  ASSERT_TRUE(rtr.ok());
  EXPECT_EQ(rtr->attr.ah_attr.is_global, 1);
  EXPECT_EQ(rtr->attr.ah_attr.grh.dgid.raw[15], 0x42);
  EXPECT_EQ(rtr->attr.ah_attr.grh.sgid_index, 3);

  remote.ethernet = false;
  EXPECT_EQ(ReadyToReceiveTransition(local, remote).status().code(), Code::kMismatch);

  QpTransition rts = ReadyToSendTransition(local);
  EXPECT_EQ(rts.attr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(rts.attr.sq_psn, 100u);
  EXPECT_LT(rts.attr.retry_cnt, 8);  // bounded retries: a dead peer errors out
}

TEST(VerbsQp, LinkStateMachine) {
  LinkState s = LinkState::kIdle;
  for (LinkEvent e : {LinkEvent::kQpInit, LinkEvent::kQpRtr, LinkEvent::kQpRts, LinkEvent::kHelloDone}) {
    auto next = Step(s, e);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    s = *next;
  }
  EXPECT_EQ(s, LinkState::kOpen);
  EXPECT_EQ(*Step(s, LinkEvent::kBye), LinkState::kDraining);
  EXPECT_EQ(*Step(LinkState::kDraining, LinkEvent::kDrained), LinkState::kClosed);
  // A connection closed inside on_accept/ConnectDone says bye before open.
  EXPECT_EQ(*Step(LinkState::kReadyToSend, LinkEvent::kBye), LinkState::kDraining);
  // Skipping a step, or traffic after close, is refused.
  EXPECT_EQ(Step(LinkState::kIdle, LinkEvent::kQpRts).status().code(), Code::kInternal);
  EXPECT_EQ(Step(LinkState::kInit, LinkEvent::kHelloDone).status().code(), Code::kInternal);
  EXPECT_EQ(Step(LinkState::kClosed, LinkEvent::kBye).status().code(), Code::kInternal);
  EXPECT_EQ(Step(LinkState::kClosed, LinkEvent::kFailure).status().code(), Code::kInternal);
  // Any live state can fail, and a failed link only closes.
  for (LinkState from : {LinkState::kIdle, LinkState::kInit, LinkState::kReadyToReceive,
                         LinkState::kReadyToSend, LinkState::kOpen, LinkState::kDraining}) {
    EXPECT_EQ(*Step(from, LinkEvent::kFailure), LinkState::kError) << LinkStateName(from);
  }
  EXPECT_EQ(*Step(LinkState::kError, LinkEvent::kDrained), LinkState::kClosed);
  EXPECT_EQ(Step(LinkState::kError, LinkEvent::kHelloDone).status().code(), Code::kInternal);
}

TEST(VerbsMtu, BytesAndEnumAgree) {
  for (uint32_t bytes : {256u, 512u, 1024u, 2048u, 4096u}) {
    auto mtu = MtuFromBytes(bytes);
    ASSERT_TRUE(mtu.ok());
    EXPECT_EQ(MtuBytes(*mtu), bytes);
  }
  EXPECT_EQ(MtuFromBytes(1500).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace tern::verbs
