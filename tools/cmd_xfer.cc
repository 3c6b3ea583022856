// `tern xfer`: a resumable, multi-stream, TLS-by-default bulk copier on top
// of the transport layer (like bbcp/gridftp), and the way the transport is
// measured. The final line of `get` is a key=value summary for scripts.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tern/transport_registry.h"
#include "tern/xfer.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern::cli {

namespace {

// The flags that choose and configure the transport, shared by serve and get
// (--tls-server-name is get's, --tls-allow-client serve's).
struct TransportArgs {
  std::string transport, verbs_device, tls_cert, tls_key, tls_ca, tls_pin, tls_server_name,
      tls_allow_client, congestion;
  bool no_tls = false;
  uint64_t notsent_lowat_bytes = 0, socket_buffer_bytes = 0, idle_timeout_ms = 0;
  // Given on the command line (an empty value is not the same as none);
  // null where the command has no such flag.
  const CLI::Option* verbs_device_flag = nullptr;
  const CLI::Option* tls_cert_flag = nullptr;
  const CLI::Option* tls_key_flag = nullptr;
  const CLI::Option* tls_ca_flag = nullptr;
  const CLI::Option* tls_pin_flag = nullptr;
  const CLI::Option* tls_server_name_flag = nullptr;
  const CLI::Option* tls_allow_client_flag = nullptr;
};

void AddTransportFlags(CLI::App& cmd, TransportArgs& t) {
  cmd.add_option("--transport", t.transport,
                 "tcp (multi-stream, TLS), ucx or verbs (RDMA inside one cluster; no encryption: "
                 "needs --no-tls)")
      ->default_val("tcp");
  t.verbs_device_flag = cmd.add_option(
      "--verbs-device", t.verbs_device,
      "RDMA device for --transport verbs (empty: the first with an active port)");
  t.tls_cert_flag =
      cmd.add_option("--tls-cert", t.tls_cert, "PEM certificate chain of this side (TLS 1.3, mutual)");
  t.tls_key_flag = cmd.add_option("--tls-key", t.tls_key, "PEM private key of this side");
  t.tls_ca_flag =
      cmd.add_option("--tls-ca", t.tls_ca, "PEM CA that must have signed the peer's certificate");
  t.tls_pin_flag = cmd.add_option(
      "--tls-pin", t.tls_pin,
      "sha256:HEX[,sha256:HEX...]: the peer's certificate must have one of these SHA-256 "
      "fingerprints (checked in addition to the CA and names)");
  cmd.add_flag("--no-tls", t.no_tls, "plain TCP (only inside a trusted network; TLS is the default)");
  cmd.add_option("--congestion", t.congestion, "TCP congestion control to ask the kernel for")
      ->default_val("bbr");
  AddCount(cmd, "--notsent-lowat", t.notsent_lowat_bytes,
           "TCP_NOTSENT_LOWAT per stream (K/M suffixes; 0: kernel default)", "1M");
  AddCount(cmd, "--socket-buffer", t.socket_buffer_bytes,
           "SO_SNDBUF/SO_RCVBUF per stream (K/M/G suffixes; 0: kernel autotuning)", "0");
  AddUnsigned(cmd, "--idle-timeout-ms", t.idle_timeout_ms,
              "close a connection whose peer is silent this long (at least 100)", "30000");
}

// "a,b" -> {"a", "b"}; an empty item stays (and is refused where it is used).
std::vector<std::string> CommaList(const std::string& text) {
  std::vector<std::string> out(1);
  for (char c : text) {
    if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

// The form TlsConfig::peer_sha256 documents: "sha256:" and 64 hex digits,
// ':' between bytes allowed. Checked here so that a mistyped pin is a usage
// error (docs/cli.md); the transport checks it again when it loads.
Status CheckPinSyntax(const std::string& pin) {
  const std::string prefix = "sha256:";
  size_t digits = 0;
  bool hex = pin.size() <= prefix.size() + 95 && pin.compare(0, prefix.size(), prefix) == 0;
  for (size_t i = prefix.size(); hex && i < pin.size(); ++i) {
    if (pin[i] == ':') continue;
    hex = std::isxdigit(static_cast<unsigned char>(pin[i])) != 0;
    ++digits;
  }
  TERN_REQUIRE(hex && digits == 64, kInvalidArgument, "--tls-pin '", pin.substr(0, 40),
               pin.size() > 40 ? "..." : "", "': want sha256:<64 hex digits>");
  return Status::Ok();
}

Result<TcpOptions> TransportOptions(const TransportArgs& t) {
  TcpOptions o;
  auto has = [](const CLI::Option* flag) { return flag != nullptr && flag->count() > 0; };
  const bool any_tls = has(t.tls_cert_flag) || has(t.tls_key_flag) || has(t.tls_ca_flag) ||
                       has(t.tls_pin_flag) || has(t.tls_server_name_flag) ||
                       has(t.tls_allow_client_flag);
  const std::string& kind = t.transport;
  TERN_REQUIRE(kind == "tcp" || kind == "ucx" || kind == "verbs", kInvalidArgument, "--transport '", kind,
               "': want tcp, ucx or verbs");
  TERN_REQUIRE(kind != "verbs" || !has(t.verbs_device_flag) || !t.verbs_device.empty(),
               kInvalidArgument, "--verbs-device is empty");
  TERN_REQUIRE(kind == "verbs" || !has(t.verbs_device_flag), kInvalidArgument,
               "--verbs-device needs --transport verbs");
  if (kind != "tcp") {
    // Say it out loud: RDMA transports carry no TLS.
    TERN_REQUIRE(t.no_tls && !any_tls, kInvalidArgument, "--transport ", kind,
                 " carries no encryption: use it inside a trusted network and pass --no-tls");
  }
  if (t.no_tls) {
    TERN_REQUIRE(!any_tls, kInvalidArgument, "--no-tls contradicts the --tls-* flags");
  } else {
    TERN_REQUIRE(has(t.tls_cert_flag) && has(t.tls_key_flag) && has(t.tls_ca_flag), kInvalidArgument,
                 "TLS is on by default: give --tls-cert, --tls-key and --tls-ca, or --no-tls");
    o.tls.enabled = true;
    o.tls.cert_file = t.tls_cert;
    o.tls.key_file = t.tls_key;
    o.tls.ca_file = t.tls_ca;
    // Who the peer must be (TlsConfig): a server name for get, allowed
    // clients for serve; names and pins are checked when the transport loads.
    if (has(t.tls_server_name_flag)) o.tls.server_name = t.tls_server_name;
    if (has(t.tls_allow_client_flag)) o.tls.client_names = CommaList(t.tls_allow_client);
    if (has(t.tls_pin_flag)) o.tls.peer_sha256 = CommaList(t.tls_pin);
    TERN_REQUIRE(o.tls.client_names.size() <= kMaxTlsNames && o.tls.peer_sha256.size() <= kMaxTlsNames,
                 kInvalidArgument, "more than ", kMaxTlsNames, " --tls-allow-client names or --tls-pin pins");
    for (const std::string& pin : o.tls.peer_sha256) TERN_RETURN_IF_ERROR(CheckPinSyntax(pin));
  }
  o.congestion = t.congestion;
  o.socket_buffer_bytes = t.socket_buffer_bytes;
  o.notsent_lowat_bytes = t.notsent_lowat_bytes;
  o.idle_timeout_ms = t.idle_timeout_ms;
  TERN_REQUIRE(o.idle_timeout_ms >= 100, kInvalidArgument, "--idle-timeout-ms below 100");
  return o;
}

// The transport --transport names, from the transport registry (TLS on
// turns "tcp" into "tcp+tls"); the TCP options carry what the flags set.
Result<std::unique_ptr<Transport>> MakeTransport(const TransportArgs& f, TcpOptions o) {
  tern::TransportOptions options;
  const std::string kind = f.transport;
  const bool tls = o.tls.enabled;
  options.tcp = std::move(o);
  if (f.verbs_device_flag->count() > 0) options.verbs.device = f.verbs_device;
  return NewTransport(kind == "tcp" && tls ? "tcp+tls" : kind, options);
}

std::string Human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  return buf;
}

struct ServeArgs {
  std::string listen, root;
  TransportArgs transport;
  TcpOptions options;  // from the flags, by the check step
};

Status Serve(ServeArgs& a) {
  const TransportArgs& f = a.transport;
  TcpOptions o = a.options;
  const bool tls = o.tls.enabled;

  // Block the stop signals before any thread starts so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  TERN_ASSIGN_OR_RETURN(auto transport, MakeTransport(f, std::move(o)));
  FileServerOptions so;
  TERN_ASSIGN_OR_RETURN(auto server, FileServer::Start(*transport, a.listen, a.root, so));
  std::printf("xfer: serving %s on %s (%s)\n", a.root.c_str(), server->address().c_str(),
              transport->name() != "tcp" ? transport->name().c_str() : tls ? "tls1.3" : "plain tcp");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "xfer: stopping on signal %d\n", sig);
  server.reset();
  return Status::Ok();
}

struct GetArgs {
  // Flags.
  std::string address, remote_name, output;
  uint64_t streams = 0, rate_hint_bps = 0, rtt_ms = 0, chunk_bytes = 0, retries = 0;
  bool no_resume = false, quiet = false, force = false;
  TransportArgs transport;
  // From the flags, by CheckGet.
  TcpOptions options;
  FetchOptions fetch;
};

Status CheckGet(GetArgs& a) {
  TERN_ASSIGN_OR_RETURN(a.options, TransportOptions(a.transport));
  TcpOptions& o = a.options;
  TERN_REQUIRE(a.streams <= o.max_streams, kInvalidArgument, "--streams above ", o.max_streams);
  o.streams = static_cast<uint32_t>(a.streams);
  o.rate_bps_hint = a.rate_hint_bps;
  TERN_REQUIRE(a.rtt_ms <= 3'600'000, kInvalidArgument, "--rtt-ms above one hour");
  o.rtt_us_hint = a.rtt_ms * 1000;
  FetchOptions& fo = a.fetch;
  fo.chunk_bytes = a.chunk_bytes;
  fo.retry.attempts = static_cast<uint32_t>(std::min<uint64_t>(a.retries, 999) + 1);
  fo.resume = !a.no_resume;
  // The head window should cover the bandwidth-delay product (the rest
  // starts a round trip later); twice it when the link is described.
  if (o.rate_bps_hint > 0 && o.rtt_us_hint > 0) {
    // 128 bits: exact hints may be as large as 2^64-1 each.
    const unsigned __int128 bdp_bytes =
        static_cast<unsigned __int128>(o.rate_bps_hint / 8) * o.rtt_us_hint / 1000000;
    const uint64_t head_max = uint64_t{1} << 30;
    fo.head_bytes = std::max<uint64_t>(
        fo.head_bytes, bdp_bytes >= head_max / 2 ? head_max : static_cast<uint64_t>(2 * bdp_bytes));
  }
  return Status::Ok();
}

Status Get(GetArgs& a) {
  const TransportArgs& f = a.transport;
  const TcpOptions& o = a.options;
  FetchOptions fo = a.fetch;
  const uint32_t chosen = f.transport == "tcp" ? ChooseTcpStreams(o) : 1;
  // Like every tern command, replace nothing without --force (docs/cli.md).
  // TODO(correctness): FetchFile renames over LOCAL; a file created there
  // after this check is still replaced.
  if (!a.force && ::access(a.output.c_str(), F_OK) == 0)
    return TERN_ERROR(kAlreadyExists, a.output, " exists (use --force to replace it)");
  const bool tty = ::isatty(2);
  double last_print = -10;
  if (!a.quiet) {
    fo.on_progress = [&](const FetchProgress& p) {
      if (p.seconds - last_print < (tty ? 0.25 : 2.0)) return;
      last_print = p.seconds;
      const double moved = static_cast<double>(p.done_bytes - p.resumed_bytes);
      const double rate = p.seconds > 0 ? moved / p.seconds : 0;
      const double left = static_cast<double>(p.total_bytes - p.done_bytes);
      const double pct = p.total_bytes ? 100.0 * p.done_bytes / p.total_bytes : 100.0;
      std::fprintf(stderr, "%s%s / %s  %5.1f%%  %.1f Mb/s  ETA %s%s", tty ? "\r" : "",
                   Human(p.done_bytes).c_str(), Human(p.total_bytes).c_str(), pct, rate * 8 / 1e6,
                   rate > 0 ? (std::to_string(static_cast<long>(std::ceil(left / rate))) + "s").c_str() : "?",
                   tty ? "   " : "\n");
    };
  }
  TERN_ASSIGN_OR_RETURN(auto transport, MakeTransport(f, o));
  TERN_ASSIGN_OR_RETURN(FetchResult r, FetchFile(*transport, a.address, a.remote_name, a.output, fo));
  if (!a.quiet && tty) std::fprintf(stderr, "\n");
  const double moved = static_cast<double>(r.bytes - r.resumed_bytes);
  std::printf("xfer: bytes=%llu seconds=%.3f gbps=%.3f streams=%u resumed_bytes=%llu reconnects=%u "
              "first_chunk_s=%.3f xxh3=%016llx link=\"%s\"\n",
              static_cast<unsigned long long>(r.bytes), r.seconds,
              r.seconds > 0 ? moved * 8 / r.seconds / 1e9 : 0.0, chosen,
              static_cast<unsigned long long>(r.resumed_bytes), r.reconnects, r.first_chunk_seconds,
              static_cast<unsigned long long>(r.xxh3), r.link.c_str());
  return Status::Ok();
}

}  // namespace

void AddXfer(CLI::App& tern, Dispatch& dispatch) {
  CLI::App* xfer = tern.add_subcommand(
      "xfer", "copy a file over multi-stream TCP/TLS with resume (serve | get)");
  xfer->require_subcommand(1);

  auto s = std::make_shared<ServeArgs>();
  CLI::App* serve = xfer->add_subcommand(
      "serve", "serve a directory or one file to `tern xfer get` until SIGINT/SIGTERM");
  serve->add_option("--listen", s->listen, "HOST:PORT to listen on (port 0: any free port, printed)")
      ->required();
  AddTransportFlags(*serve, s->transport);
  s->transport.tls_allow_client_flag = serve->add_option(
      "--tls-allow-client", s->transport.tls_allow_client,
      "NAME[,NAME...]: a client's certificate must hold one of these DNS names or IPs "
      "(default: any the CA signed)");
  serve->add_option("DIR_OR_FILE", s->root, "what to serve; names may not escape it")->required();
  dispatch.On(serve, {[s]() -> Status {
                        TERN_ASSIGN_OR_RETURN(s->options, TransportOptions(s->transport));
                        return Status::Ok();
                      },
                      [s] { return Serve(*s); }});

  auto g = std::make_shared<GetArgs>();
  CLI::App* get = xfer->add_subcommand(
      "get", "fetch REMOTE_NAME from a `tern xfer serve` at HOST:PORT, resumable");
  get->footer(
      "The copy is written to LOCAL.tern-part beside LOCAL and renamed to LOCAL only\n"
      "after its whole-file checksum matched. A failed fetch keeps LOCAL.tern-part\n"
      "(at most the remote file's size) and LOCAL.tern-part.state for the next get to\n"
      "LOCAL to resume, but only when some chunk arrived; a fetch refused or failed\n"
      "before that leaves nothing. Both go once the copy is complete, on a checksum\n"
      "mismatch, or when the remote file changed (the fetch starts over); delete them\n"
      "to drop a partial copy by hand.");
  get->add_option("-o,--output", g->output, "local file to write; see below for LOCAL.tern-part")
      ->type_name("LOCAL")
      ->required();
  AddForceFlag(*get, g->force, "replace an existing LOCAL");
  AddUnsigned(*get, "--streams", g->streams,
              "parallel TCP streams (0: from --rate-hint/--rtt-ms, else 8)", "0");
  AddCount(*get, "--rate-hint", g->rate_hint_bps, "link rate in bit/s (K/M/G suffixes) to size the streams",
           "0");
  AddUnsigned(*get, "--rtt-ms", g->rtt_ms, "round-trip time in ms to size the streams", "0");
  AddCount(*get, "--chunk", g->chunk_bytes,
           "chunk size (K/M suffixes): the unit of checksum, ack and resume", "4M");
  AddUnsigned(*get, "--retries", g->retries, "reconnect attempts after a broken connection",
              "8");
  get->add_flag("--no-resume", g->no_resume, "ignore LOCAL.tern-part.state, and keep no partial copy on failure");
  get->add_flag("--quiet", g->quiet, "no progress on stderr");
  AddTransportFlags(*get, g->transport);
  g->transport.tls_server_name_flag = get->add_option(
      "--tls-server-name", g->transport.tls_server_name,
      "DNS name or IP the server's certificate must hold (default: the HOST dialled)");
  get->add_option("HOST:PORT", g->address, "the server")->required();
  get->add_option("REMOTE_NAME", g->remote_name, "file name relative to the served directory")
      ->required();
  dispatch.On(get, {[g] { return CheckGet(*g); }, [g] { return Get(*g); }});
}

}  // namespace tern::cli
