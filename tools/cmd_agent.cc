// `tern-agent` (also `tern agent`): the transfer agent daemon, and the two
// commands that talk to a root's admin port: `tern publish` and
// `tern status`. docs/agent.md, docs/cli.md.
#include <malloc.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <thread>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tern/agent.h"
#include "tern/transport_registry.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/transport_flags.h"

namespace tern::cli {
namespace {

struct AgentArgs {
  bool root = false;
  std::string join, listen, admin, data, id, region, cluster, island;
  std::string transport_intra, listen_intra;
  bool no_relay = false;
  bool relay_only = false;
  bool no_stream_apply = false;
  double uplink_gbps = 10, downlink_gbps = 10;
  std::string signing_key, join_token_file, admin_token_file, engine_sidecar_token_file;
  std::string admin_tls_cert, admin_tls_key, admin_tls_client_ca;
  std::vector<std::string> trust_keys;
  std::vector<std::string> key_sets;
  uint32_t stripes = 1, fanout = 4, root_fanout = 8, keep_patches = 16, keyframe_every = 32;
  uint32_t heartbeat_ms = 500, dead_after_ms = 3000, etcd_lease_s = 3, spare_grace_ms = 2000;
  std::string board_etcd, seed;
  std::string etcd_cacert, etcd_cert, etcd_key, etcd_password_file;
  uint64_t seed_version = 0;
  uint32_t parent_stall_ms = 10000;
  uint32_t relay_probation_ms = 60000;
  uint32_t beacon_interval_ms = 1000, stale_after_ms = 5000, beacon_max_skew_ms = 30000;
  uint64_t max_lag_versions = 1;
  std::string patch_format = "auto";
  bool no_patch_nibbles = false;
  uint32_t push_window_bytes = uint32_t{2} << 20;
  uint32_t tcp_streams = 0;
  unsigned threads = 0;
  std::string malloc_arenas = "auto";
  int arenas = 0;  // parsed --malloc-arenas
  TransportArgs transport;
  TcpOptions options;
  AgentOptions agent;
};

// The --etcd-* files, read as carefully as the admin token: bounded, and
// the key and password never echoed.
Status ReadEtcdAccess(AgentArgs& a) {
  AgentOptions& o = a.agent;
  const bool any = !a.etcd_cacert.empty() || !a.etcd_cert.empty() || !a.etcd_key.empty() ||
                   !o.etcd_user.empty() || !a.etcd_password_file.empty() || o.etcd_insecure;
  TERN_REQUIRE(!any || !a.board_etcd.empty(), kInvalidArgument,
               "the --etcd-* flags go with --board-etcd");
  TERN_RETURN_IF_ERROR(ReadPemFlags({{&a.etcd_cacert, &o.etcd_ca_pem, "--etcd-cacert"},
                                     {&a.etcd_cert, &o.etcd_cert_pem, "--etcd-cert"},
                                     {&a.etcd_key, &o.etcd_key_pem, "--etcd-key"}}));
  TERN_REQUIRE((a.etcd_cacert.empty() && a.etcd_cert.empty() && a.etcd_key.empty()) ||
                   a.board_etcd.rfind("etcds://", 0) == 0,
               kInvalidArgument,
               "--etcd-cacert/--etcd-cert/--etcd-key are for TLS: use an etcds:// board URL");
  TERN_REQUIRE(a.etcd_password_file.empty() || !o.etcd_user.empty(), kInvalidArgument,
               "--etcd-password-file needs --etcd-user");
  if (!o.etcd_user.empty()) {
    auto password = ReadSecret(a.etcd_password_file, "TERN_ETCD_PASSWORD");
    if (!password.ok()) return password.status().WithContext("--etcd-password-file");
    o.etcd_password = std::move(*password);
    TERN_REQUIRE(!o.etcd_password.empty(), kInvalidArgument, "--etcd-user ", o.etcd_user,
                 " needs a password: --etcd-password-file FILE (or $TERN_ETCD_PASSWORD)");
  }
  return Status::Ok();
}

// The daemon's heap policy, set before any thread starts. glibc's default
// (up to 8 arenas per core, and an mmap threshold that rises to the largest
// block freed, up to 32 MiB) let the root's ~90 threads keep every freed
// view, patch and squash buffer resident: the soak saw its anonymous memory
// climb 7 → 134 MB in 8 minutes and hold at 41–48 MB with 2 arenas
// (docs/soak.md). A fixed threshold returns every block of 1 MiB and more to
// the kernel when freed; the arena cap bounds what small blocks keep. Only
// the daemon does this: a process that embeds libtern keeps its own policy.

// --malloc-arenas as a count: 0 leaves glibc's defaults.
Result<int> ParseMallocArenas(const std::string& flag) {
  if (flag == "glibc") return 0;
  if (flag == "auto") return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 8u));
  char* end = nullptr;
  const long n = std::strtol(flag.c_str(), &end, 10);
  TERN_REQUIRE(end != flag.c_str() && *end == '\0' && n >= 1 && n <= 64, kInvalidArgument,
               "--malloc-arenas: expected auto, glibc or 1..64, got '", flag, "'");
  return static_cast<int>(n);
}

// Best effort: another allocator (a sanitizer's, or tcmalloc or jemalloc
// preloaded) ignores mallopt; the daemon then says so and runs on.
void ApplyMallocPolicy(int arenas) {
  if (arenas == 0) return;
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr || std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr)
    return;  // the operator's environment wins
  if (mallopt(M_ARENA_MAX, arenas) != 1 || mallopt(M_MMAP_THRESHOLD, 1 << 20) != 1)
    std::fprintf(stderr,
                 "tern-agent: note: the allocator ignored mallopt (not glibc's malloc): "
                 "--malloc-arenas has no effect\n");
}

Status CheckAgent(AgentArgs& a) {
  TERN_REQUIRE(a.root != !a.join.empty(), kInvalidArgument, "give exactly one of --root and --join HOST:PORT");
  TERN_REQUIRE(a.uplink_gbps > 0 && a.downlink_gbps > 0, kInvalidArgument, "link rates must be > 0");
  TERN_REQUIRE(a.root || !a.trust_keys.empty(), kInvalidArgument,
               "a member needs --trust-key PEM (the root writes DIR/public-key.pem)");
  TERN_ASSIGN_OR_RETURN(a.options, TransportOptions(a.transport));
  a.options.streams = a.tcp_streams;
  TERN_REQUIRE(a.transport_intra.empty() == a.listen_intra.empty(), kInvalidArgument,
               "give both or neither of --transport-intra NAME and --listen-intra HOST:PORT");
  TERN_REQUIRE(a.transport_intra.empty() || !a.cluster.empty(), kInvalidArgument,
               "--transport-intra needs --cluster C (edges inside that cluster use it)");
  TERN_ASSIGN_OR_RETURN(a.arenas, ParseMallocArenas(a.malloc_arenas));
  AgentOptions& o = a.agent;
  o.root = a.root;
  o.join = a.join;
  o.listen = a.listen;
  o.admin_listen = a.admin;
  o.data_dir = a.data;
  o.id = a.id;
  o.region = a.region;
  o.cluster = a.cluster;
  o.island = a.island;
  o.may_relay = !a.no_relay;
  o.relay_only = a.relay_only;
  o.uplink_bytes_per_s = a.uplink_gbps * 1e9 / 8;
  o.downlink_bytes_per_s = a.downlink_gbps * 1e9 / 8;
  if (!a.signing_key.empty()) {
    TERN_RETURN_IF_ERROR(ReadFileToString(DefaultEnv(), a.signing_key, 64 << 10, &o.signing_key_pem));
  }
  for (const auto& path : a.trust_keys) {
    std::string pem;
    TERN_RETURN_IF_ERROR(ReadFileToString(DefaultEnv(), path, 64 << 10, &pem));
    o.trusted_keys_pem.push_back(std::move(pem));
  }
  for (const auto& path : a.key_sets) {
    std::string bytes;
    TERN_RETURN_IF_ERROR(ReadFileToString(DefaultEnv(), path, 64 << 10, &bytes));
    o.key_sets.push_back(std::move(bytes));
  }
  TERN_ASSIGN_OR_RETURN(o.join_token, ReadSecret(a.join_token_file, "TERN_JOIN_TOKEN"));
  TERN_ASSIGN_OR_RETURN(o.admin_token, ReadSecret(a.admin_token_file, "TERN_ADMIN_TOKEN"));
  TERN_REQUIRE(a.admin_tls_cert.empty() == a.admin_tls_key.empty(), kInvalidArgument,
               "give both --admin-tls-cert and --admin-tls-key, or neither");
  TERN_REQUIRE(a.admin_tls_cert.empty() || !a.admin.empty(), kInvalidArgument,
               "--admin-tls-cert/--admin-tls-key go with --admin HOST:PORT");
  TERN_REQUIRE(a.admin_tls_client_ca.empty() || !a.admin_tls_cert.empty(), kInvalidArgument,
               "--admin-tls-client-ca goes with --admin-tls-cert and --admin-tls-key (client "
               "certificates are a TLS feature)");
  TERN_RETURN_IF_ERROR(
      ReadPemFlags({{&a.admin_tls_cert, &o.admin_tls_cert_pem, "--admin-tls-cert"},
                    {&a.admin_tls_key, &o.admin_tls_key_pem, "--admin-tls-key"},
                    {&a.admin_tls_client_ca, &o.admin_tls_client_ca_pem, "--admin-tls-client-ca"}}));
  if (!o.engine_sidecar.empty()) {
    TERN_ASSIGN_OR_RETURN(o.engine_sidecar_token,
                          ReadSecret(a.engine_sidecar_token_file, "TERN_SIDECAR_ADMIN_TOKEN"));
  }
  o.stripes = a.stripes;
  o.fanout_max = a.fanout;
  o.root_fanout_max = a.root_fanout;
  o.keep_patches = a.keep_patches;
  o.keyframe_every = a.keyframe_every;
  o.patch_format = a.patch_format == "auto" ? 0 : static_cast<uint16_t>(std::stoi(a.patch_format));
  o.patch_nibbles = !a.no_patch_nibbles;
  o.board_etcd = a.board_etcd;
  o.seed_checkpoint = a.seed;
  o.seed_version = a.seed_version;
  o.etcd_lease_s = a.etcd_lease_s;
  TERN_REQUIRE(a.board_etcd.empty() || a.root, kInvalidArgument, "--board-etcd is a root's flag");
  TERN_RETURN_IF_ERROR(ReadEtcdAccess(a));
  o.heartbeat_ms = a.heartbeat_ms;
  o.dead_after_ms = a.dead_after_ms;
  o.spare_grace_ms = a.spare_grace_ms;
  o.stream_apply = !a.no_stream_apply;
  o.parent_stall_ms = a.parent_stall_ms;
  o.relay_probation_ms = a.relay_probation_ms;
  o.beacon_interval_ms = a.beacon_interval_ms;
  o.stale_after_ms = a.stale_after_ms;
  o.beacon_max_skew_ms = a.beacon_max_skew_ms;
  o.max_lag_versions = a.max_lag_versions;
  o.push_window_bytes = a.push_window_bytes;
  o.threads = a.threads;
  return Status::Ok();
}

Status RunAgent(AgentArgs& a) {
  ApplyMallocPolicy(a.arenas);
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGUSR1);  // "started", from the starting thread
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  const pthread_t main_thread = pthread_self();

  TERN_ASSIGN_OR_RETURN(auto transport, MakeTransport(a.transport, a.options));
  a.agent.transport = transport.get();
  // TEST ONLY: the soak's corrupting and rewriting relays (tests/soak/soak.py,
  // docs/soak.md). An environment variable, not a flag, so that no operator
  // finds it in --help or a config file; it is logged whenever set.
  // Declared after `transport`, so destroyed before it.
  std::unique_ptr<Transport> faulty;
  if (const char* faults = std::getenv("TERN_TEST_FAULTS")) {
    TERN_ASSIGN_OR_RETURN(faulty, NewTestFaultTransport(*transport, faults));
    a.agent.transport = faulty.get();
    std::fprintf(stderr, "tern-agent: WARNING: TERN_TEST_FAULTS=%s: the transport injects faults (test only)\n",
                 faults);
  }
  std::unique_ptr<Transport> intra;
  if (!a.transport_intra.empty()) {
    const LogFn log = StderrLog();
    TERN_ASSIGN_OR_RETURN(intra, MakeIntraTransport(a.transport_intra, a.transport, a.options,
                                                    transport->name(), [&](std::string_view line) {
                                                      log("tern-agent: " + std::string(line));
                                                    }));
    if (intra) {
      a.agent.intra_transport = intra.get();
      a.agent.listen_intra = a.listen_intra;
    }
  }
  // A standby root waits inside Start until it leads: start on a thread so
  // that a signal meanwhile still stops the process.
  std::promise<Result<std::unique_ptr<Agent>>> started;
  auto started_future = started.get_future();
  std::thread starter([&] {
    started.set_value(Agent::Start(a.agent));
    pthread_kill(main_thread, SIGUSR1);
  });
  int sig = 0;
  while (started_future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    sigwait(&stop, &sig);
    if (sig != SIGUSR1) {
      std::fprintf(stderr, "tern-agent: stopping on signal %d while starting\n", sig);
      std::fflush(stderr);
      std::_Exit(0);  // nothing is served yet; a waiting standby holds no lease
    }
  }
  starter.join();
  Result<std::unique_ptr<Agent>> start_result = started_future.get();
  if (!start_result.ok()) return start_result.status();
  std::unique_ptr<Agent> agent = std::move(start_result).value();
  const AgentSnapshot s = agent->Snapshot();
  if (a.root) {
    // Members need this key (--trust-key); it is public.
    const std::string pem = agent->PublicKeyPem();
    TERN_RETURN_IF_ERROR(WriteFileAtomic(DefaultEnv(), a.data + "/public-key.pem",
                                         {reinterpret_cast<const uint8_t*>(pem.data()), pem.size()}, true));
  }
  std::printf("tern-agent: %s %s listening on %s%s%s%s%s\n",
              a.root         ? "root"
              : a.relay_only ? "relay-only member"
                             : "member",
              s.id.c_str(), s.listen_address.c_str(),
              s.intra_address.empty() ? "" : ", intra-cluster on ", s.intra_address.c_str(),
              s.admin_address.empty()                         ? ""
              : s.admin_address.rfind("https://", 0) == 0 ? ", admin "
                                                            : ", admin http://",
              s.admin_address.c_str());
  std::fflush(stdout);
  do {
    sigwait(&stop, &sig);
  } while (sig == SIGUSR1);
  std::fprintf(stderr, "tern-agent: stopping on signal %d\n", sig);
  agent->Stop();
  return Status::Ok();
}

struct PublishArgs {
  std::string board, checkpoint, token_file;
  AdminTlsArgs tls;
  uint64_t version = 0;
  uint32_t timeout_s = 600;
  bool force = false;
  bool supersede = false;
};

Status RunPublish(const PublishArgs& a) {
  AgentClientOptions o;
  TERN_ASSIGN_OR_RETURN(o.token, ReadSecret(a.token_file, "TERN_ADMIN_TOKEN"));
  TERN_RETURN_IF_ERROR(ReadAdminTls(a.tls, o));
  o.timeout_ms = a.timeout_s * 1000;
  o.force = a.force;
  o.supersede = a.supersede;
  const double t0 = NowSeconds();
  TERN_RETURN_IF_ERROR(PublishToRoot(a.board, a.checkpoint, a.version, o));
  std::printf("published version %llu%s in %.2f s\n", static_cast<unsigned long long>(a.version),
              a.supersede ? " (a supersede: the next board epoch)" : "", NowSeconds() - t0);
  return Status::Ok();
}

// The demoted column of `tern status`: why, how often, and when the member
// may relay again ("stalled x2, relays in 37 s"; "-" when never demoted).
std::string DemotionText(const nlohmann::json& m) {
  const unsigned long long n = m.contains("demotions") && m["demotions"].is_number_unsigned()
                                   ? m["demotions"].get<unsigned long long>()
                                   : 0;
  if (n == 0) return "-";
  const std::string why = m.contains("demoted_for") && m["demoted_for"].is_string()
                              ? m["demoted_for"].get<std::string>()
                              : "?";
  const bool demoted =
      m.contains("demoted") && m["demoted"].is_boolean() && m["demoted"].get<bool>();
  const double in_s = m.contains("relay_again_in_s") && m["relay_again_in_s"].is_number()
                          ? m["relay_again_in_s"].get<double>()
                          : -1;
  char text[96];
  if (!demoted) {
    std::snprintf(text, sizeof text, "relays again (%s x%llu before)", why.c_str(), n);
  } else if (in_s < 0) {
    std::snprintf(text, sizeof text, "%s x%llu, a leaf until it rejoins", why.c_str(), n);
  } else {
    std::snprintf(text, sizeof text, "%s x%llu, relays in %.0f s", why.c_str(), n, in_s);
  }
  return text;
}

struct StatusArgs {
  std::string board;
  AdminTlsArgs tls;
  bool json = false;
};

Status RunStatus(const StatusArgs& a) {
  AgentClientOptions o;
  o.timeout_ms = 10000;
  TERN_RETURN_IF_ERROR(ReadAdminTls(a.tls, o));
  TERN_ASSIGN_OR_RETURN(std::string reply, AgentStatusJson(a.board, o));
  if (a.json) {
    std::fputs(reply.c_str(), stdout);
    return Status::Ok();
  }
  nlohmann::json j = nlohmann::json::parse(reply, nullptr, false);
  TERN_REQUIRE(j.is_object(), kCorrupt, "the agent at ", a.board, " answered /status with something not JSON");
  auto u = [](const nlohmann::json& v, const char* k) -> unsigned long long {
    return v.contains(k) && v[k].is_number_unsigned() ? v[k].get<unsigned long long>() : 0;
  };
  auto d = [](const nlohmann::json& v, const char* k) -> double {
    return v.contains(k) && v[k].is_number() ? v[k].get<double>() : 0.0;
  };
  auto s = [](const nlohmann::json& v, const char* k) -> std::string {
    return v.contains(k) && v[k].is_string() ? v[k].get<std::string>() : "";
  };
  if (s(j, "role") == "relay-only") {
    std::printf("relay-only %s: HEAD %llu, holding %llu (serves nothing)\n", s(j, "id").c_str(),
                u(j, "head"), u(j, "held_version"));
  } else {
    std::printf("%s %s: HEAD %llu, serving %llu\n", s(j, "role").c_str(), s(j, "id").c_str(),
                u(j, "head"), u(j, "served_version"));
  }
  if (j.contains("members") && j["members"].is_array() && !j["members"].empty()) {
    // role "relay": a relay-only member, whose version is the newest it holds.
    std::printf("%-20s %-10s %-10s %-5s %8s %4s %-20s %5s %12s %12s %8s %9s %9s  %s\n", "member",
                "region", "island", "role", "version", "lag", "parent", "depth", "in", "out",
                "MB/s in", "rtt_p ms", "rtt_r ms", "demoted");
    for (const auto& m : j["members"]) {
      if (!m.is_object()) continue;
      // A demoted member (its children reported it bad) is marked with '!'.
      const bool demoted =
          m.contains("demoted") && m["demoted"].is_boolean() && m["demoted"].get<bool>();
      std::printf(
          "%-20s %-10s %-10s %-5s %8llu %4llu %-20s %5llu %12s %12s %8.1f %9.2f %9.2f  %s\n",
          (s(m, "id") + (demoted ? "!" : "")).c_str(), s(m, "region").c_str(),
          s(m, "island").c_str(), s(m, "role") == "relay-only" ? "relay" : "serve", u(m, "version"),
          u(m, "lag"), s(m, "parent").c_str(), u(m, "depth"), HumanBytes(u(m, "bytes_in")).c_str(),
          HumanBytes(u(m, "bytes_out")).c_str(), d(m, "rate_in_bytes_per_s") / 1e6,
          d(m, "rtt_to_parent_s") * 1e3, d(m, "rtt_to_root_s") * 1e3, DemotionText(m).c_str());
    }
  }
  if (j.contains("versions") && j["versions"].is_array() && !j["versions"].empty()) {
    std::printf("\n%8s %12s %12s %10s %10s\n", "version", "patch", "view", "first_s", "last_s");
    for (const auto& v : j["versions"]) {
      if (!v.is_object()) continue;
      std::printf("%8llu %12s %12s %10.3f %10.3f\n", u(v, "version"), HumanBytes(u(v, "patch_bytes")).c_str(),
                  HumanBytes(u(v, "view_bytes")).c_str(), d(v, "first_served_s"), d(v, "last_served_s"));
    }
  }
  return Status::Ok();
}

}  // namespace

void AddAgentFlags(CLI::App& cmd, Dispatch& dispatch) {
  auto a = std::make_shared<AgentArgs>();
  cmd.set_config("--config", "", "read flags from a TOML/INI file (flag = value per line)");
  cmd.add_flag("--root", a->root, "run the root: the board of versions, the signer, the planner");
  cmd.add_option("--join", a->join, "member: the root's HOST:PORT (with standbys: HOST:PORT,HOST:PORT,...)");
  cmd.add_option("--board-etcd", a->board_etcd,
                 "root: etcd://HOST:PORT[,HOST:PORT]/PREFIX (etcds:// for TLS): the board in etcd; roots "
                 "campaign there and a standby waits until it leads");
  AddUnsigned(cmd, "--etcd-lease-s", a->etcd_lease_s, "root: leadership lease (a dead root is replaced after it)",
              "3", 3600);
  cmd.add_option("--etcd-cacert", a->etcd_cacert,
                 "root: PEM CA file etcd's certificate must chain to (etcds://; default: the system's "
                 "trust store)");
  cmd.add_option("--etcd-cert", a->etcd_cert,
                 "root: PEM client certificate for etcd's --client-cert-auth (with --etcd-key)");
  cmd.add_option("--etcd-key", a->etcd_key, "root: PEM private key of --etcd-cert (unencrypted)");
  cmd.add_option("--etcd-user", a->agent.etcd_user, "root: etcd user (etcd's auth enabled)");
  cmd.add_option("--etcd-password-file", a->etcd_password_file,
                 "root: file with --etcd-user's password (default: $TERN_ETCD_PASSWORD)");
  cmd.add_flag("--etcd-insecure", a->agent.etcd_insecure,
               "root: allow an etcd endpoint off loopback over plain http or without a client "
               "certificate or user (anyone reaching etcd could rewrite the board)");
  cmd.add_option("--malloc-arenas", a->malloc_arenas,
                 "heap: auto (one arena per core, 2..8, and blocks of 1 MiB and more returned to the "
                 "kernel when freed), N arenas, or glibc (its defaults); MALLOC_ARENA_MAX in the "
                 "environment wins")
      ->default_val("auto");
  cmd.add_option("--listen", a->listen, "HOST:PORT for control and data (port 0: any)")->required();
  cmd.add_option("--admin", a->admin, "HOST:PORT for HTTP /metrics, /status (root: POST /publish)");
  cmd.add_option("--data", a->data, "DIR: DIR/current is the served checkpoint")->required();
  cmd.add_option("--id", a->id, "member id (default: the listen address)");
  cmd.add_option("--region", a->region, "region (planning: one WAN crossing per region)")->default_val("default");
  cmd.add_option("--cluster", a->cluster, "cluster inside the region (empty: its own)");
  cmd.add_option(
      "--transport-intra", a->transport_intra,
      "the transport for edges inside --cluster (verbs, ucx, tcp: plain; tcp+tls); one this "
      "machine lacks is logged and --transport used instead");
  cmd.add_option("--listen-intra", a->listen_intra,
                 "HOST:PORT for --transport-intra (port 0: any)");
  cmd.add_option("--island", a->island, "island (engines sharing this copy)");
  auto* no_relay =
      cmd.add_flag("--no-relay", a->no_relay, "never forward to others (a leaf in every tree)");
  cmd.add_flag(
      "--no-stream-apply", a->no_stream_apply,
      "member: apply a patch only once it is complete, not segment by segment as it arrives");
  cmd.add_option("--uplink-gbps", a->uplink_gbps, "uplink rate for planning until measured")->default_val("10");
  cmd.add_option("--downlink-gbps", a->downlink_gbps, "downlink rate for planning")->default_val("10");
  cmd.add_option("--signing-key", a->signing_key,
                 "root: Ed25519 private key PEM (default: DIR/signing-key.pem, generated once)");
  cmd.add_option("--trust-key", a->trust_keys,
                 "the publisher's public key PEM (repeatable): key set 0; a member needs one, a root "
                 "that rotated keys names the keys of key set 0 with it");
  cmd.add_option("--key-set", a->key_sets,
                 "root: a signed key set from `tern keys rotate` (repeatable, key set 1 first); sent "
                 "to every member (docs/agent/operations.md)");
  auto* seed = cmd.add_option("--seed", a->seed,
                              "member: a checkpoint already held of --seed-version, adopted only if its digest "
                              "is the signed one (saves fetching it)");
  cmd.add_option("--seed-version", a->seed_version, "member: the version --seed holds")->needs(seed);
  seed->needs(cmd.get_option("--seed-version"));
  cmd.add_option("--join-token-file", a->join_token_file,
                 "file with the join token (default: $TERN_JOIN_TOKEN; none: no token)");
  cmd.add_option("--admin-token-file", a->admin_token_file,
                 "file with the bearer token for POST /publish (default: $TERN_ADMIN_TOKEN)");
  cmd.add_flag("--admin-insecure", a->agent.admin_insecure,
               "root: allow --admin off loopback without a token or without TLS (anyone reaching "
               "it, or watching the network, can publish)");
  cmd.add_option("--admin-tls-cert", a->admin_tls_cert,
                 "PEM certificate (then intermediates) for --admin: the port speaks HTTPS only; "
                 "clients dial https://HOST:PORT (needed with --admin off loopback on a root)");
  cmd.add_option("--admin-tls-key", a->admin_tls_key,
                 "PEM private key of --admin-tls-cert (unencrypted)");
  cmd.add_option("--admin-tls-client-ca", a->admin_tls_client_ca,
                 "PEM CA file: the admin port requires a client certificate it signed (mutual "
                 "TLS, on top of the token; clients give --admin-cert and --admin-key)");
  cmd.add_option(
      "--publish-dir", a->agent.publish_dir,
      "root: POST /publish reads checkpoints only under this directory (default: anywhere)");
  AddUnsigned(cmd, "--max-version-jump", a->agent.max_version_jump,
              "root: POST /publish refuses a version more than this beyond HEAD unless forced "
              "(0: no bound)",
              "1000000");
  AddUnsigned(cmd, "--stripes", a->stripes, "root: trees a version is striped over (1-8)", "1", 8);
  AddUnsigned(cmd, "--fanout", a->fanout, "root: children per member per stripe", "4", 1024);
  AddUnsigned(cmd, "--root-fanout", a->root_fanout, "root: children of the root per stripe", "8", 1024);
  AddUnsigned(cmd, "--keep-patches", a->keep_patches, "root: patches kept for catch-up", "16");
  AddUnsigned(cmd, "--keyframe-every", a->keyframe_every, "root: a keyframe every N versions", "32");
  cmd.add_option("--patch-format", a->patch_format,
                 "root: patch format: auto (per version, the one predicted to bring the last "
                 "member to serve sooner from the members' measured apply and receive rates; "
                 "/status says why), or force 2 (~0.7x format 1's bytes) or 1 (applies 2.7-6x "
                 "faster per byte of view) (docs/agent.md \"Choosing the patch format\")")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto", "1", "2"}));
  cmd.add_flag("--no-patch-nibbles", a->no_patch_nibbles,
               "root: format 2 codes packed 4-bit codes (NVFP4, MXFP4, INT4) by their bytes, not "
               "as nibbles, so every patch stays at file version 2: for members whose tern "
               "predates patch file version 3 (docs/format/patch.md)");
  AddUnsigned(cmd, "--push-window-bytes", a->push_window_bytes,
              "member: bytes of the window per parent into which a new object's first chunks are "
              "pushed without a WANT round trip (0: no push)",
              "2097152", 64u << 20);
  AddUnsigned(cmd, "--tcp-streams", a->tcp_streams,
              "TCP streams per link this agent dials (1-64; 0: 8). With BBR each stream keeps "
              "its own share of the link's rate after a large object, and a small patch goes "
              "out on one stream at that share: fewer streams send small patches faster over "
              "long links (docs/transport.md, \"Streams and BBR\")",
              "0", 64);
  AddUnsigned(cmd, "--window-chunks", a->agent.window_chunks,
              "member: chunk windows open per parent link and object", "16", 4096)
      ->check(CLI::Range(1, 4096));
  AddUnsigned(cmd, "--window-bytes", a->agent.window_bytes,
              "member: at most this many bytes of those windows (at least one; 0: count chunks "
              "only). A relay holds its windows and its children's while an object passes; a "
              "link carries at most this much per round trip",
              "67108864", uint64_t{1} << 32);
  AddUnsigned(cmd, "--heartbeat-ms", a->heartbeat_ms,
              "root: the members' heartbeat period (members take the root's once joined)", "500");
  AddUnsigned(cmd, "--dead-after-ms", a->dead_after_ms, "root: drop a member silent this long", "3000");
  AddUnsigned(cmd, "--spare-grace-ms", a->spare_grace_ms,
              "member: readers of DIR/current keep the version switched away from this long, then "
              "the spare is brought up (off the next version's critical path)",
              "2000", 3'600'000);
  AddUnsigned(
      cmd, "--parent-stall-ms", a->parent_stall_ms,
      "root: members report a parent that sends nothing this long while a version is due "
      "(0: never), and the root judges those reports by the parent's own heartbeats over this "
      "long; members take the root's value once joined",
      "10000");
  AddUnsigned(cmd, "--relay-probation-ms", a->relay_probation_ms,
              "root: a relay demoted for its children's reports relays again after this long "
              "(doubled per repeat, up to 16x; 16x at once for chunks that failed SHA-256; 0: a "
              "leaf until it rejoins)",
              "60000");
  AddUnsigned(cmd, "--beacon-interval-ms", a->beacon_interval_ms,
              "root: send every member a signed HEAD beacon this often", "1000", 600'000);
  AddUnsigned(cmd, "--stale-after-ms", a->stale_after_ms,
              "member: stale (cut off) when no valid HEAD beacon came for this long; the control "
              "connection is then dropped and dialled again",
              "5000", 3'600'000);
  AddUnsigned(cmd, "--beacon-max-skew-ms", a->beacon_max_skew_ms,
              "member: refuse a beacon whose root wall time is further than this from ours",
              "30000", 86'400'000);
  AddUnsigned(cmd, "--max-lag-versions", a->max_lag_versions,
              "member: stale (behind) when the signed HEAD is more than this many versions ahead "
              "of what it serves",
              "1");
  cmd.add_option("--on-serve", a->agent.on_serve_command,
                 "COMMAND run with sh -c each time a version is served: the event as JSON on "
                 "stdin and in TERN_EVENT_* variables; one run at a time, versions served "
                 "meanwhile coalesced into one run for the newest (docs/agent/operations.md)");
  AddUnsigned(cmd, "--on-serve-timeout-ms", a->agent.on_serve_timeout_ms,
              "kill an --on-serve run (its process group) after this long", "60000", 86'400'000);
  cmd.add_option("--engine", a->agent.engine,
                 "member: load every version it serves into this engine beside it: vllm or "
                 "sglang (docs/engines.md, \"The agent drives the engine\")")
      ->check(CLI::IsMember({"vllm", "sglang"}));
  cmd.add_option("--engine-url", a->agent.engine_url,
                 "with --engine: the engine's http://HOST:PORT (vLLM started from DIR/current with "
                 "--weight-transfer-config '{\"backend\": \"tern\"}' and VLLM_SERVER_DEV_MODE=1; "
                 "SGLang started with --model-path DIR/current)");
  cmd.add_option("--engine-pause", a->agent.engine_pause,
                 "requests in flight during an update: keep (frozen, resumed on the new weights; "
                 "SGLang: pause mode in_place), wait (drained first) or abort")
      ->check(CLI::IsMember({"keep", "wait", "abort"}))
      ->default_str("keep");
  cmd.add_flag("--engine-no-cache-reset", [a](int64_t) { a->agent.engine_reset_prefix_cache = false; },
               "do not reset the engine's prefix cache after an update (the sidecar's per-version "
               "cache_salt keeps versions apart)");
  AddUnsigned(cmd, "--engine-timeout-ms", a->agent.engine_update_timeout_ms,
              "deadline of one update call (the engine reads and loads the changed tensors)", "300000",
              3'600'000);
  AddUnsigned(cmd, "--engine-attempts", a->agent.engine_attempts,
              "update sequences per version before backing off (1 s doubling to 30 s)", "2", 100);
  cmd.add_option("--engine-sidecar", a->agent.engine_sidecar,
                 "with --engine: the tern-sidecar in front of the engine (HOST:PORT); every update "
                 "runs inside a commit it holds open, so no response is stamped with a version it "
                 "did not run on");
  cmd.add_option("--engine-sidecar-token-file", a->engine_sidecar_token_file,
                 "file with that sidecar's admin token (its --admin-token-file; default: "
                 "$TERN_SIDECAR_ADMIN_TOKEN)");
  // The flags of a serving member (or of the root) make no sense with it:
  // refused rather than ignored.
  cmd.add_flag("--relay-only", a->relay_only,
               "member: relay and serve nothing (no DIR/current, no apply; planned as an interior "
               "relay first; its version is the newest it holds)")
      ->excludes(no_relay)
      ->excludes(seed)
      ->excludes(cmd.get_option("--seed-version"))
      ->excludes(cmd.get_option("--root"))
      ->excludes(cmd.get_option("--no-stream-apply"))
      ->excludes(cmd.get_option("--spare-grace-ms"))
      ->excludes(cmd.get_option("--on-serve"));
  AddThreadsFlag(cmd, a->threads);
  AddTransportFlags(cmd, a->transport);
  a->transport.tls_allow_client_flag = cmd.add_option(
      "--tls-allow-client", a->transport.tls_allow_client,
      "NAME[,NAME...]: a peer's certificate must hold one of these names (default: any the CA signed)");
  dispatch.On(&cmd, {[a] { return CheckAgent(*a); }, [a] { return RunAgent(*a); }});
}

void AddAgent(CLI::App& tern, Dispatch& dispatch) {
  CLI::App* agent = tern.add_subcommand("agent", "run the transfer agent (same as tern-agent)");
  AddAgentFlags(*agent, dispatch);

  auto p = std::make_shared<PublishArgs>();
  CLI::App* publish = tern.add_subcommand("publish", "publish a checkpoint as a new version on a root");
  publish->add_option("--board", p->board, "the root's admin [https://]HOST:PORT")->required();
  AddAdminTlsFlags(*publish, p->tls, "the root's");
  AddUnsigned(*publish, "--version", p->version, "the new version (newer than HEAD)", "");
  publish->get_option("--version")->required();
  publish->add_option("--token-file", p->token_file, "bearer token file (default: $TERN_ADMIN_TOKEN)");
  AddUnsigned(*publish, "--timeout-s", p->timeout_s,
              "wait this long for the outcome (the root goes on publishing after it)", "600");
  publish->add_flag("--force", p->force,
                    "publish a version far beyond HEAD (the root's --max-version-jump)");
  publish->add_flag("--supersede", p->supersede,
                    "recover from a wrong version number: publish --version below HEAD, a number "
                    "the board does not hold, as the first version of the next board epoch "
                    "(HEAD and what lies above the new version are withdrawn; members follow)");
  publish->add_option("CHECKPOINT", p->checkpoint, "safetensors file or directory, as the root sees it")
      ->required();
  dispatch.On(publish, {nullptr, [p] { return RunPublish(*p); }});

  auto s = std::make_shared<StatusArgs>();
  CLI::App* status = tern.add_subcommand("status", "members, versions and lag of a root (or one agent)");
  status->add_option("--board", s->board, "the agent's admin [https://]HOST:PORT")->required();
  AddAdminTlsFlags(*status, s->tls, "the agent's");
  status->add_flag("--json", s->json, "print the /status JSON as it came");
  dispatch.On(status, {nullptr, [s] { return RunStatus(*s); }});
}

}  // namespace tern::cli
