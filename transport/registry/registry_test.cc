// The transport registry: making a backend by name, and the probe's reasons when a backend cannot run here.
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

}  // namespace
}  // namespace tern
