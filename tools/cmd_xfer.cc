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
#include "tools/transport_flags.h"

namespace tern::cli {

namespace {

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
  std::string listen, root, token_file;
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
  TERN_ASSIGN_OR_RETURN(so.access_token, ReadSecret(a.token_file, "TERN_XFER_TOKEN"));
  TERN_REQUIRE(so.access_token.size() <= 1024, kInvalidArgument, "access token over 1024 bytes");
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
  std::string address, remote_name, output, token_file;
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
  TERN_ASSIGN_OR_RETURN(fo.access_token, ReadSecret(a.token_file, "TERN_XFER_TOKEN"));
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
  serve->add_option("--token-file", s->token_file,
                    "file with an access token every GET must carry (default: $TERN_XFER_TOKEN; none: "
                    "no token)");
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
  get->add_option("--token-file", g->token_file,
                  "file with the server's access token (default: $TERN_XFER_TOKEN)");
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
