// `tern-sidecar`: the version-aware reverse proxy in front of one
// OpenAI-compatible engine on a replica (docs/engines.md, "The sidecar";
// include/tern/sidecar.h).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <tuple>

#include "tern/env.h"
#include "tern/sidecar.h"
#include "tools/cli_util.h"

namespace {

using namespace tern;
using namespace tern::cli;

struct SidecarArgs {
  SidecarConfig config;
  std::string agent_token_file, agent_cacert, agent_cert, agent_key, admin_token_file,
      commit_mode = "in_place";
  bool no_cache_salt = false;
};

Status Check(SidecarArgs& a) {
  SidecarConfig& c = a.config;
  TERN_REQUIRE(!c.agent_admin.empty() || !c.version_file.empty(), kInvalidArgument,
               "one of --agent-admin or --version-file is required");
  TERN_REQUIRE(a.commit_mode == "in_place" || a.commit_mode == "quiesce", kInvalidArgument,
               "--commit-mode must be in_place or quiesce, not ", a.commit_mode);
  c.quiesce = a.commit_mode == "quiesce";
  c.cache_salt = !a.no_cache_salt;
  TERN_ASSIGN_OR_RETURN(c.admin_token, ReadSecret(a.admin_token_file, "TERN_SIDECAR_ADMIN_TOKEN"));
  TERN_ASSIGN_OR_RETURN(c.agent_token, ReadSecret(a.agent_token_file, "TERN_ADMIN_TOKEN"));
  if (!a.agent_cacert.empty()) {
    TERN_REQUIRE(c.agent_admin.rfind("https://", 0) == 0, kInvalidArgument,
                 "--agent-admin-cacert goes with an https:// --agent-admin");
    Status read = ReadFileToString(DefaultEnv(), a.agent_cacert, 64 << 10, &c.agent_ca_pem);
    if (!read.ok()) return read.WithContext("--agent-admin-cacert");
  }
  TERN_REQUIRE(a.agent_cert.empty() == a.agent_key.empty(), kInvalidArgument,
               "give both --agent-admin-cert and --agent-admin-key, or neither");
  if (!a.agent_cert.empty()) {
    TERN_REQUIRE(c.agent_admin.rfind("https://", 0) == 0, kInvalidArgument,
                 "--agent-admin-cert goes with an https:// --agent-admin");
    for (auto [path, pem, flag] :
         {std::tuple{&a.agent_cert, &c.agent_cert_pem, "--agent-admin-cert"},
          std::tuple{&a.agent_key, &c.agent_key_pem, "--agent-admin-key"}}) {
      Status read = ReadFileToString(DefaultEnv(), *path, 64 << 10, pem);
      if (!read.ok()) return read.WithContext(flag);
    }
  }
  return Status::Ok();
}

Status Run(SidecarArgs& a) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before any thread starts
  TERN_ASSIGN_OR_RETURN(auto sidecar, SidecarService::Start(a.config));
  const SidecarConfig& c = a.config;
  std::printf(
      "tern-sidecar: http://%s in front of %s, served version from %s\n",
      sidecar->address().c_str(), c.engine_url.c_str(),
      c.agent_admin.empty() ? c.version_file.c_str() : ("the member at " + c.agent_admin).c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "tern-sidecar: stopping on signal %d\n", sig);
  sidecar->Stop();
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "tern-sidecar: serve an engine's generation routes only on the versions each request "
      "accepts.\n"
      "  tern-sidecar --engine-url http://127.0.0.1:8000 --agent-admin 127.0.0.1:9090 "
      "[--listen HOST:PORT]",
      "tern-sidecar");
  Configure(app);
  app.footer(
      "The request lane, status codes and metrics: docs/engines.md. Exit statuses: docs/cli.md. "
      "Stops on SIGINT/SIGTERM.");
  SidecarArgs a;
  app.add_option("--listen", a.config.listen, "HOST:PORT clients connect to (port 0: any)")
      ->default_str(a.config.listen);
  app.add_option("--engine-url", a.config.engine_url, "the engine, http://HOST:PORT")->required();
  auto* admin = app.add_option("--agent-admin", a.config.agent_admin,
                               "[https://]HOST:PORT of the local member's admin port: the served "
                               "version is "
                               "its /status served_version");
  auto* file = app.add_option("--version-file", a.config.version_file,
                              "instead: a file holding the served version (one decimal number)");
  admin->excludes(file);
  app.add_option("--agent-admin-cacert", a.agent_cacert,
                 "PEM CA file an https:// --agent-admin's certificate must chain to (default: the "
                 "system's trust store)");
  app.add_option("--agent-admin-cert", a.agent_cert,
                 "PEM client certificate for an --agent-admin that requires one (its "
                 "--admin-tls-client-ca signed it)");
  app.add_option("--agent-admin-key", a.agent_key,
                 "PEM private key of --agent-admin-cert (unencrypted)");
  app.add_option("--agent-token-file", a.agent_token_file,
                 "file with the member's admin token (default: $TERN_ADMIN_TOKEN)");
  app.add_option("--admin-token-file", a.admin_token_file,
                 "file with the token that lets a request through to the engine's control routes "
                 "(header X-Tern-Admin-Token; default: $TERN_SIDECAR_ADMIN_TOKEN; none: refused "
                 "to all)");
  app.add_option("--commit-mode", a.commit_mode,
                 "in_place: only exact-version requests finish before the version changes; "
                 "quiesce: all do")
      ->default_str(a.commit_mode);
  app.add_flag("--refuse-when-stale", a.config.refuse_when_stale,
               "refuse every versioned request (503 MemberStale, retryable) while the member "
               "reports itself stale; without it only requests with X-Tern-Max-Staleness are");
  AddUnsigned(app, "--catchup-wait-ms", a.config.catchup_wait_ms,
              "how long a request for a known, not yet applied version waits before 409", "2000");
  AddUnsigned(app, "--poll-ms", a.config.poll_ms, "how often the served version is read", "200");
  AddUnsigned(app, "--drain-timeout-ms", a.config.drain_timeout_ms,
              "how long a version change waits for requests that must finish first (then retried)",
              "60000");
  AddUnsigned(app, "--workers", a.config.workers, "requests handled at once", "128", 4096);
  AddUnsigned(app, "--client-timeout-ms", a.config.client_timeout_ms,
              "per read or write from a client (a slower one is dropped)", "30000");
  AddUnsigned(app, "--engine-timeout-ms", a.config.engine_timeout_ms,
              "per read from the engine (a long prefill sends nothing for a while)", "3600000");
  AddCount(app, "--max-body-bytes", a.config.max_body_bytes, "largest request body (413 over it)",
           "16M");
  AddCount(app, "--max-response-bytes", a.config.max_response_bytes,
           "largest whole (unstreamed) engine reply (502 over it)", "64M");
  app.add_flag("--no-cache-salt", a.no_cache_salt,
               "do not key the engine's prefix cache by version (cache_salt / extra_key)");
  Dispatch dispatch;
  dispatch.On(&app, {[&] { return Check(a); }, [&] { return Run(a); }});
  return dispatch.Run(app, argc, argv);
}
