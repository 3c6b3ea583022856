// The transport registry: making a backend by name, choosing one by peer,
// and the probe's reasons when a backend cannot run here.
#include "tern/transport_registry.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tern/loopback_transport.h"
#include "transport/test_certs.h"

namespace tern {
namespace {

std::string Text(const Status& s) { return s.ToString(); }

TEST(TransportRegistry, MakesEachPortableBackendByName) {
  LoopbackNetwork network;
  TransportOptions o;
  o.loopback_network = &network;
  auto loopback = NewTransport("loopback", o);
  ASSERT_TRUE(loopback.ok()) << Text(loopback.status());
  EXPECT_EQ((*loopback)->name(), "loopback");

  auto tcp = NewTransport("tcp", o);
  ASSERT_TRUE(tcp.ok()) << Text(tcp.status());
  EXPECT_EQ((*tcp)->name(), "tcp");
  auto listener = (*tcp)->Listen("127.0.0.1:0", [](std::shared_ptr<Connection>) { return ConnectionHandlers{}; });
  ASSERT_TRUE(listener.ok()) << Text(listener.status());

  const auto& pki = testing::TestCerts();
  ASSERT_TRUE(pki.ok) << pki.error;
  o.tcp.tls = pki.server;
  o.tcp.tls.enabled = false;  // the name turns it on
  auto tls = NewTransport("tcp+tls", o);
  ASSERT_TRUE(tls.ok()) << Text(tls.status());
  EXPECT_EQ((*tls)->name(), "tcp+tls");
  EXPECT_NE((*tls)->capabilities() & kCapEncrypted, 0u);
}

TEST(TransportRegistry, RefusesUnknownNamesAndContradictions) {
  TransportOptions o;
  Status unknown = NewTransport("quic", o).status();
  EXPECT_EQ(unknown.code(), Code::kInvalidArgument);
  EXPECT_NE(unknown.message().find("unknown transport 'quic' (known: verbs, ucx, tcp, tcp+tls, loopback)"),
            std::string::npos)
      << Text(unknown);
  EXPECT_EQ(NewTransport("", o).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(NewTransport("TCP", o).status().code(), Code::kInvalidArgument);  // names are exact

  EXPECT_EQ(NewTransport("loopback", o).status().code(), Code::kInvalidArgument);  // no network

  o.tcp.tls.enabled = true;
  Status plain = NewTransport("tcp", o).status();
  EXPECT_EQ(plain.code(), Code::kInvalidArgument);
  EXPECT_NE(plain.message().find("ask for 'tcp+tls'"), std::string::npos) << Text(plain);
  o.tcp.tls = TlsConfig{};
  Status no_files = NewTransport("tcp+tls", o).status();
  EXPECT_EQ(no_files.code(), Code::kInvalidArgument);
  EXPECT_NE(no_files.message().find("needs a certificate"), std::string::npos) << Text(no_files);
}

// Where an RDMA backend cannot run (the usual CI machine), NewTransport says
// so with the probe's reason; where it can, it makes it.
TEST(TransportRegistry, RdmaBackendsWorkOrSayWhyNot) {
  TransportOptions o;
  o.ucx.tls = "tcp";
  o.ucx.net_devices = "lo";
  for (const auto& [name, probe] : {std::pair{std::string("verbs"), ProbeVerbs()},
                                    std::pair{std::string("ucx"), ProbeUcx()}}) {
    auto made = NewTransport(name, o);
    if (probe.available) {
      EXPECT_TRUE(made.ok()) << name << ": " << Text(made.status());
      if (made.ok()) {
        EXPECT_EQ((*made)->name(), name);
      }
    } else {
      ASSERT_FALSE(made.ok()) << name << " made although the probe says: " << probe.detail;
      EXPECT_EQ(made.status().code(), Code::kUnavailable) << Text(made.status());
      EXPECT_NE(made.status().message().find(probe.detail), std::string::npos)
          << name << ": " << Text(made.status()) << " lacks the probe's reason: " << probe.detail;
    }
  }
}

TEST(TransportRegistry, UcxMayListenAgainOnItsPortUnlessTheUserSaidOtherwise) {
  if (!ProbeUcx().available) GTEST_SKIP() << "ucx: " << ProbeUcx().detail;
  TransportOptions o;
  o.ucx.tls = "tcp";
  o.ucx.net_devices = "lo";
  ::unsetenv("UCX_TCP_CM_REUSEADDR");
  ASSERT_TRUE(NewTransport("ucx", o).ok());
  ASSERT_NE(std::getenv("UCX_TCP_CM_REUSEADDR"), nullptr);
  EXPECT_STREQ(std::getenv("UCX_TCP_CM_REUSEADDR"), "y");
  ::setenv("UCX_TCP_CM_REUSEADDR", "n", 1);
  ASSERT_TRUE(NewTransport("ucx", o).ok());
  EXPECT_STREQ(std::getenv("UCX_TCP_CM_REUSEADDR"), "n");
  ::unsetenv("UCX_TCP_CM_REUSEADDR");
}

TEST(TransportRegistry, ProbeListsEveryBackendOnce) {
  std::vector<BackendProbe> probes = ProbeTransports();
  std::vector<std::string> names;
  for (const auto& p : probes) {
    names.push_back(p.backend);
    EXPECT_FALSE(p.detail.empty()) << p.backend << " without a word of what was found or why not";
  }
  EXPECT_EQ(names, (std::vector<std::string>{"verbs", "ucx", "tcp", "loopback"}));
}

// ---- by peer, over a probe result the test chooses ----

std::vector<BackendProbe> Probes(bool verbs, bool ucx) {
  return {{"verbs", verbs, verbs ? "mlx5_0:1 active" : "libibverbs.so.1 loaded, 0 devices"},
          {"ucx", ucx, ucx ? "tcp,rc" : "built without UCX"},
          {"tcp", true, "congestion control available: bbr"},
          {"loopback", true, "in-process"}};
}

const PeerLocation kSelf{"a", "us", "c1"};
const PeerLocation kNear{"b", "us", "c1"};
const PeerLocation kOtherCluster{"c", "us", "c2"};
const PeerLocation kOtherRegion{"d", "eu", "c1"};  // same cluster name, elsewhere

std::string Choose(const PeerPolicy& p, const PeerLocation& peer, const std::vector<BackendProbe>& probes) {
  Result<std::string> r = ChooseTransport(p, kSelf, peer, probes);
  return r.ok() ? *r : "error: " + Text(r.status());
}

TEST(TransportRegistry, RdmaInsideOneClusterTcpWithTlsAcross) {
  PeerPolicy p;
  EXPECT_EQ(Choose(p, kNear, Probes(true, true)), "verbs");
  EXPECT_EQ(Choose(p, kNear, Probes(false, true)), "ucx");
  EXPECT_EQ(Choose(p, kNear, Probes(false, false)), "tcp");  // no TLS inside by default
  EXPECT_EQ(Choose(p, kOtherCluster, Probes(true, true)), "tcp+tls");
  EXPECT_EQ(Choose(p, kOtherRegion, Probes(true, true)), "tcp+tls");
  // A location we do not know leaves the cluster.
  EXPECT_EQ(Choose(p, PeerLocation{"e", "", ""}, Probes(true, true)), "tcp+tls");
  PeerLocation nowhere{"z", "", ""};
  Result<std::string> unknown_self = ChooseTransport(p, nowhere, nowhere, Probes(true, true));
  ASSERT_TRUE(unknown_self.ok());
  EXPECT_EQ(*unknown_self, "tcp+tls");
}

TEST(TransportRegistry, TlsSettingsDecideWhatMayCarryALink) {
  PeerPolicy p;
  p.tls_inside_cluster = true;  // only tcp encrypts: RDMA is passed over
  EXPECT_EQ(Choose(p, kNear, Probes(true, true)), "tcp+tls");
  p = PeerPolicy{};
  p.tls_leaving_cluster = false;  // a trusted private interconnect
  EXPECT_EQ(Choose(p, kOtherCluster, Probes(true, true)), "tcp");
  p.cross_cluster = "ucx";
  EXPECT_EQ(Choose(p, kOtherCluster, Probes(true, true)), "ucx");
}

TEST(TransportRegistry, OverridesPinABackendWithinTheRules) {
  PeerPolicy p;
  p.overrides["b"] = "tcp";
  EXPECT_EQ(Choose(p, kNear, Probes(true, true)), "tcp");
  p.overrides["c"] = "ucx";
  Result<std::string> no_tls = ChooseTransport(p, kSelf, kOtherCluster, Probes(true, true));
  EXPECT_EQ(no_tls.status().code(), Code::kInvalidArgument);
  EXPECT_NE(no_tls.status().message().find("carries no TLS"), std::string::npos) << Text(no_tls.status());
  p.tls_leaving_cluster = false;
  EXPECT_EQ(Choose(p, kOtherCluster, Probes(true, true)), "ucx");
  Result<std::string> missing = ChooseTransport(p, kSelf, kOtherCluster, Probes(true, false));
  EXPECT_EQ(missing.status().code(), Code::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("built without UCX"), std::string::npos)
      << Text(missing.status());
  p.overrides["c"] = "rdma";
  EXPECT_EQ(ChooseTransport(p, kSelf, kOtherCluster, Probes(true, true)).status().code(),
            Code::kInvalidArgument);
}

TEST(TransportRegistry, NothingAvailableSaysWhyForEachCandidate) {
  PeerPolicy p;
  p.same_cluster = {"verbs", "ucx"};
  Result<std::string> r = ChooseTransport(p, kSelf, kNear, Probes(false, false));
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("verbs: libibverbs.so.1 loaded, 0 devices"), std::string::npos)
      << Text(r.status());
  EXPECT_NE(r.status().message().find("ucx: built without UCX"), std::string::npos) << Text(r.status());
  p.same_cluster = {"verbs", "infiniband"};
  EXPECT_EQ(ChooseTransport(p, kSelf, kNear, Probes(true, true)).status().code(), Code::kInvalidArgument);
  p = PeerPolicy{};
  p.cross_cluster = "carrier-pigeon";
  EXPECT_EQ(ChooseTransport(p, kSelf, kOtherCluster, Probes(true, true)).status().code(),
            Code::kInvalidArgument);
}

TEST(TransportRegistry, NewTransportForPeerMakesTheChoice) {
  PeerPolicy p;
  p.same_cluster = {"tcp"};
  auto near = NewTransportForPeer(p, kSelf, kNear, TransportOptions{});
  ASSERT_TRUE(near.ok()) << Text(near.status());
  EXPECT_EQ((*near)->name(), "tcp");
  // Across clusters TLS is required and no files were given: refused, not
  // silently plain.
  auto far = NewTransportForPeer(p, kSelf, kOtherCluster, TransportOptions{});
  EXPECT_EQ(far.status().code(), Code::kInvalidArgument) << Text(far.status());
}

}  // namespace
}  // namespace tern
