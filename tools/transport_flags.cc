#include "tools/transport_flags.h"

#include <cctype>

#include "tern/transport_registry.h"
#include "tools/cli_args.h"

namespace tern::cli {
namespace {

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

// TcpOptions' default max_wire_version is the newest wire version the
// linked TCP backend speaks.
uint32_t NewestWireVersion() { return TcpOptions{}.max_wire_version; }

}  // namespace

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
  AddCount(cmd, "--min-frame-rate", t.min_frame_bytes_per_s,
           "bytes a second a frame being received must arrive at, at least: a frame of N bytes "
           "gets 10 s + N / rate before the connection is closed (K/M/G suffixes; 0: no "
           "minimum; lower it for a starved machine or a slow link)",
           "65536");
  AddUnsigned(cmd, "--min-wire-version", t.min_wire_version,
              "oldest TCP wire version to accept, 1 or 2 (2: every peer must checksum its "
              "control messages; docs/format/tcp.md)",
              "1", NewestWireVersion());
}

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
  o.min_frame_bytes_per_s = t.min_frame_bytes_per_s;
  TERN_REQUIRE(o.idle_timeout_ms >= 100, kInvalidArgument, "--idle-timeout-ms below 100");
  TERN_REQUIRE(t.min_wire_version >= 1, kInvalidArgument, "--min-wire-version 0: want 1 or ",
               NewestWireVersion());
  o.min_wire_version = t.min_wire_version;
  return o;
}

Result<std::unique_ptr<Transport>> MakeTransport(const TransportArgs& f, TcpOptions o) {
  tern::TransportOptions options;
  const std::string kind = f.transport;
  const bool tls = o.tls.enabled;
  options.tcp = std::move(o);
  if (f.verbs_device_flag->count() > 0) options.verbs.device = f.verbs_device;
  return NewTransport(kind == "tcp" && tls ? "tcp+tls" : kind, options);
}

Result<std::unique_ptr<Transport>> MakeIntraTransport(const std::string& name,
                                                      const TransportArgs& f, TcpOptions o,
                                                      const std::string& fallback,
                                                      const LogFn& log) {
  tern::TransportOptions options;
  if (name != "tcp+tls") o.tls.enabled = false;  // only tcp+tls carries TLS
  options.tcp = std::move(o);
  if (f.verbs_device_flag && f.verbs_device_flag->count() > 0)
    options.verbs.device = f.verbs_device;
  auto t = NewTransport(name, options);
  if (t.ok() || t.status().code() != Code::kUnavailable) return t;
  log("intra-cluster transport " + name + " is not available here (" + t.status().message() +
      "); edges inside the cluster use " + fallback + " like the others");
  return std::unique_ptr<Transport>();
}

}  // namespace tern::cli
