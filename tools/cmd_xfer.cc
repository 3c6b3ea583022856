// `tern xfer`: a resumable, multi-stream, TLS-by-default bulk copier on top
// of the transport layer (like bbcp/gridftp), and the way the transport is
// measured. The final line of `get` is a key=value summary for scripts.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tern/xfer.h"
#include "tern/tcp_transport.h"
#include "tern/ucx_transport.h"
#include "tern/verbs_transport.h"
#include "tools/flags.h"

namespace tern::cli {

namespace {

void AddTransportFlags(Flags& f) {
  f.Add("transport",
        "tcp (multi-stream, TLS), ucx or verbs (RDMA inside one cluster; no encryption: "
        "needs --no-tls)",
        "tcp");
  f.Add("verbs-device", "RDMA device for --transport verbs (empty: the first with an active port)");
  f.Add("tls-cert", "PEM certificate chain of this side (TLS 1.3, mutual)");
  f.Add("tls-key", "PEM private key of this side");
  f.Add("tls-ca", "PEM CA that must have signed the peer's certificate");
  f.Add("tls-pin",
        "sha256:HEX[,sha256:HEX...]: the peer's certificate must have one of these SHA-256 "
        "fingerprints (checked in addition to the CA and names)");
  f.AddSwitch("no-tls", "plain TCP (only inside a trusted network; TLS is the default)");
  f.Add("congestion", "TCP congestion control to ask the kernel for", "bbr");
  f.Add("notsent-lowat", "TCP_NOTSENT_LOWAT per stream (K/M suffixes; 0: kernel default)", "1M");
  f.Add("socket-buffer", "SO_SNDBUF/SO_RCVBUF per stream (K/M/G suffixes; 0: kernel autotuning)", "0");
  f.Add("idle-timeout-ms", "close a connection whose peer is silent this long", "30000");
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

Result<TcpOptions> TransportOptions(const Flags& f) {
  TcpOptions o;
  const bool any_tls = f.Has("tls-cert") || f.Has("tls-key") || f.Has("tls-ca") || f.Has("tls-pin") ||
                       f.Has("tls-server-name") || f.Has("tls-allow-client");
  const std::string kind = f.Get("transport");
  TERN_REQUIRE(kind == "tcp" || kind == "ucx" || kind == "verbs", kInvalidArgument, "--transport '", kind,
               "': want tcp, ucx or verbs");
  TERN_REQUIRE(kind != "verbs" || !f.Has("verbs-device") || !f.Get("verbs-device").empty(),
               kInvalidArgument, "--verbs-device is empty");
  TERN_REQUIRE(kind == "verbs" || !f.Has("verbs-device"), kInvalidArgument,
               "--verbs-device needs --transport verbs");
  if (kind != "tcp") {
    // Say it out loud: RDMA transports carry no TLS.
    TERN_REQUIRE(f.Switch("no-tls") && !any_tls, kInvalidArgument, "--transport ", kind,
                 " carries no encryption: use it inside a trusted network and pass --no-tls");
  }
  if (f.Switch("no-tls")) {
    TERN_REQUIRE(!any_tls, kInvalidArgument, "--no-tls contradicts the --tls-* flags");
  } else {
    TERN_REQUIRE(f.Has("tls-cert") && f.Has("tls-key") && f.Has("tls-ca"), kInvalidArgument,
                 "TLS is on by default: give --tls-cert, --tls-key and --tls-ca, or --no-tls");
    o.tls.enabled = true;
    o.tls.cert_file = f.Get("tls-cert");
    o.tls.key_file = f.Get("tls-key");
    o.tls.ca_file = f.Get("tls-ca");
    // Who the peer must be (TlsConfig): a server name for get, allowed
    // clients for serve; names and pins are checked when the transport loads.
    if (f.Has("tls-server-name")) o.tls.server_name = f.Get("tls-server-name");
    if (f.Has("tls-allow-client")) o.tls.client_names = CommaList(f.Get("tls-allow-client"));
    if (f.Has("tls-pin")) o.tls.peer_sha256 = CommaList(f.Get("tls-pin"));
  }
  o.congestion = f.Get("congestion");
  TERN_ASSIGN_OR_RETURN(o.socket_buffer_bytes, ParseCount(f.Get("socket-buffer")));
  TERN_ASSIGN_OR_RETURN(o.notsent_lowat_bytes, ParseCount(f.Get("notsent-lowat")));
  TERN_ASSIGN_OR_RETURN(o.idle_timeout_ms, f.GetU64("idle-timeout-ms"));
  TERN_REQUIRE(o.idle_timeout_ms >= 100, kInvalidArgument, "--idle-timeout-ms below 100");
  return o;
}

// The transport --transport names, built from the TCP options (the others
// take only what applies to them).
Result<std::unique_ptr<Transport>> MakeTransport(const Flags& f, TcpOptions o) {
  const std::string kind = f.Get("transport");
  if (kind == "ucx") {
    // A restarted server must listen on its port again while its old
    // connections linger (TIME_WAIT), as with tcp. UCX 1.13 binds with
    // SO_REUSEADDR only when its environment says so (ucp_config_modify
    // does not reach its connection manager). Set before UCX starts any
    // thread; a value the user set wins.
    ::setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
    UcxOptions u;
    return NewUcxTransport(u);
  }
  if (kind == "verbs") {
    VerbsOptions v;
    if (f.Has("verbs-device")) v.device = f.Get("verbs-device");
    return NewVerbsTransport(v);
  }
  return NewTcpTransport(std::move(o));
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

Status Serve(int argc, char** argv) {
  Flags f("xfer serve", "serve a directory or one file to `tern xfer get` until SIGINT/SIGTERM");
  f.Add("listen", "HOST:PORT to listen on (port 0: any free port, printed)", "", true);
  AddTransportFlags(f);
  f.Add("tls-allow-client",
        "NAME[,NAME...]: a client's certificate must hold one of these DNS names or IPs "
        "(default: any the CA signed)");
  f.AddPositional("DIR_OR_FILE", "what to serve; names may not escape it");
  TERN_RETURN_IF_ERROR(f.Parse(argc, argv));
  TERN_REQUIRE(f.positional().size() == 1, kInvalidArgument, "serve needs exactly one DIR_OR_FILE");
  TERN_ASSIGN_OR_RETURN(TcpOptions o, TransportOptions(f));
  const bool tls = o.tls.enabled;

  // Block the stop signals before any thread starts so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  TERN_ASSIGN_OR_RETURN(auto transport, MakeTransport(f, std::move(o)));
  FileServerOptions so;
  TERN_ASSIGN_OR_RETURN(auto server, FileServer::Start(*transport, f.Get("listen"), f.positional()[0], so));
  std::printf("xfer: serving %s on %s (%s)\n", f.positional()[0].c_str(), server->address().c_str(),
              transport->name() != "tcp" ? transport->name().c_str() : tls ? "tls1.3" : "plain tcp");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "xfer: stopping on signal %d\n", sig);
  server.reset();
  return Status::Ok();
}

Status Get(int argc, char** argv) {
  // "-o LOCAL" is the conventional spelling; the parser knows --long flags.
  std::vector<std::string> args(argv, argv + argc);
  for (auto& a : args) {
    if (a == "-o") a = "--output";
  }
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());

  Flags f("xfer get",
          "fetch REMOTE_NAME from a `tern xfer serve` at HOST:PORT, resumable\n\n"
          "The copy is written to LOCAL.tern-part beside LOCAL and renamed to LOCAL only\n"
          "after its whole-file checksum matched. A failed fetch keeps LOCAL.tern-part\n"
          "(at most the remote file's size) and LOCAL.tern-part.state for the next get to\n"
          "LOCAL to resume, but only when some chunk arrived; a fetch refused or failed\n"
          "before that leaves nothing. Both go once the copy is complete, on a checksum\n"
          "mismatch, or when the remote file changed (the fetch starts over); delete them\n"
          "to drop a partial copy by hand.");
  f.Add("output", "local file to write (also -o); see above for LOCAL.tern-part", "", true);
  f.Add("streams", "parallel TCP streams (0: from --rate-hint/--rtt-ms, else 8)", "0");
  f.Add("rate-hint", "link rate in bit/s (K/M/G suffixes) to size the streams", "0");
  f.Add("rtt-ms", "round-trip time in ms to size the streams", "0");
  f.Add("chunk", "chunk size (K/M suffixes): the unit of checksum, ack and resume", "4M");
  f.Add("retries", "reconnect attempts after a broken connection", "8");
  f.AddSwitch("no-resume", "ignore LOCAL.tern-part.state, and keep no partial copy on failure");
  f.AddSwitch("quiet", "no progress on stderr");
  AddTransportFlags(f);
  f.Add("tls-server-name",
        "DNS name or IP the server's certificate must hold (default: the HOST dialled)");
  f.AddPositional("HOST:PORT", "the server");
  f.AddPositional("REMOTE_NAME", "file name relative to the served directory");
  TERN_RETURN_IF_ERROR(f.Parse(static_cast<int>(av.size()), av.data()));
  TERN_REQUIRE(f.positional().size() == 2, kInvalidArgument, "get needs HOST:PORT and REMOTE_NAME");
  TERN_ASSIGN_OR_RETURN(TcpOptions o, TransportOptions(f));
  TERN_ASSIGN_OR_RETURN(uint64_t streams, f.GetU64("streams"));
  TERN_REQUIRE(streams <= o.max_streams, kInvalidArgument, "--streams above ", o.max_streams);
  o.streams = static_cast<uint32_t>(streams);
  TERN_ASSIGN_OR_RETURN(o.rate_bps_hint, ParseCount(f.Get("rate-hint")));
  TERN_ASSIGN_OR_RETURN(uint64_t rtt_ms, f.GetU64("rtt-ms"));
  o.rtt_us_hint = rtt_ms * 1000;
  const uint32_t chosen = f.Get("transport") == "tcp" ? ChooseTcpStreams(o) : 1;

  FetchOptions fo;
  TERN_ASSIGN_OR_RETURN(fo.chunk_bytes, ParseCount(f.Get("chunk")));
  TERN_ASSIGN_OR_RETURN(uint64_t retries, f.GetU64("retries"));
  fo.retry.attempts = static_cast<uint32_t>(std::min<uint64_t>(retries + 1, 1000));
  fo.resume = !f.Switch("no-resume");
  // The head window should cover the bandwidth-delay product (the rest
  // starts a round trip later); twice it when the link is described.
  if (o.rate_bps_hint > 0 && o.rtt_us_hint > 0) {
    const uint64_t bdp_bytes = o.rate_bps_hint / 8 * o.rtt_us_hint / 1000000;
    fo.head_bytes = std::clamp<uint64_t>(2 * bdp_bytes, fo.head_bytes, uint64_t{1} << 30);
  }
  const bool tty = ::isatty(2);
  double last_print = -10;
  if (!f.Switch("quiet")) {
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
  TERN_ASSIGN_OR_RETURN(FetchResult r, FetchFile(*transport, f.positional()[0], f.positional()[1],
                                                 f.Get("output"), fo));
  if (!f.Switch("quiet") && tty) std::fprintf(stderr, "\n");
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

int RunXfer(int argc, char** argv) {
  const std::string usage =
      "usage: tern xfer serve --listen HOST:PORT [TLS flags | --no-tls] [--transport T] DIR_OR_FILE\n"
      "       tern xfer get HOST:PORT REMOTE_NAME -o LOCAL [--streams N] [TLS flags | --no-tls]\n"
      "                [--transport tcp|ucx|verbs]\n"
      "       (tern xfer serve --help, tern xfer get --help for all flags)\n";
  if (argc < 2) {
    std::fputs(usage.c_str(), stderr);
    return 2;
  }
  const std::string sub = argv[1];
  if (sub == "--help" || sub == "-h") {
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  if (sub == "serve") return Report("xfer serve", Serve(argc - 1, argv + 1));
  if (sub == "get") return Report("xfer get", Get(argc - 1, argv + 1));
  std::fprintf(stderr, "tern xfer: unknown subcommand '%s'\n%s", sub.c_str(), usage.c_str());
  return 2;
}

}  // namespace tern::cli
