// A real etcd for tests: one member on 127.0.0.1, random free ports, a
// fresh data directory under $TMPDIR, output in <dir>/etcd.log. Shipped for
// the agent's tests (etcd and the lead's multi-agent tests), not for
// production.
//
//   auto server = EtcdTestServer::Start();
//   if (!server.ok() && server.status().code() == Code::kUnsupported)
//     GTEST_SKIP() << server.status().ToString();   // no etcd binary
//   EtcdOptions o; o.endpoints = {(*server)->endpoint()};
//
// The binary is $TERN_ETCD, else `etcd` on PATH; Start returns kUnsupported
// (and nothing else) when there is none, so a test can skip on exactly that.
// Every wait is bounded (start_timeout_ms). The destructor kills etcd
// (SIGKILL) and removes the data directory.
//
// Thread safety: one thread drives a server; endpoint() is constant while
// running (Restart keeps the ports).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tern/status.h"

namespace tern::agent {

struct EtcdTestServerOptions {
  uint32_t start_timeout_ms = 15000;  // until /health answers
  // Raft ticks small enough for leases of 1-2 s (etcd's minimum lease TTL
  // is 1.5 election timeouts).
  uint32_t heartbeat_ms = 50;
  uint32_t election_ms = 250;
};

class EtcdTestServer {
 public:
  static Result<std::unique_ptr<EtcdTestServer>> Start(EtcdTestServerOptions options = {});
  ~EtcdTestServer();
  EtcdTestServer(const EtcdTestServer&) = delete;
  EtcdTestServer& operator=(const EtcdTestServer&) = delete;

  // "127.0.0.1:<client port>", for EtcdOptions::endpoints.
  std::string endpoint() const;
  const std::string& data_dir() const { return dir_; }
  bool running() const { return pid_ > 0; }

  // SIGKILL (a crash) or SIGTERM (a clean stop), then waits for the exit.
  Status Kill();
  Status Stop();
  // Starts etcd again on the same ports and data (after Kill/Stop).
  Status Restart();

 private:
  EtcdTestServer(EtcdTestServerOptions options, std::string binary, std::string dir);
  Status Launch();
  Status WaitHealthy();
  Status Signal(int sig);

  EtcdTestServerOptions options_;
  std::string binary_;
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace tern::agent
