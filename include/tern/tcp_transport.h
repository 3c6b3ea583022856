// The TCP backend: N parallel streams per connection with chunks striped over
// them, autotuned socket buffers, BBR when the kernel has it, an XXH3-64 checksum
// and an acknowledgement per chunk, and optional TLS 1.3 with mutual
// authentication. Wire format: docs/format/tcp.md.
//
// Each stream has one I/O thread (non-blocking socket + poll), so threads are
// bounded by streams x connections, and both are capped (max_streams,
// max_connections). Every wait is bounded: connect, handshake, header and
// idle timeouts.
//
// Thread safety: as transport.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tern/export.h"
#include "tern/transport.h"

namespace tern {

// Who the peer must be. Both sides check that the CA signed the peer's
// certificate (mutual TLS); a client also checks that the server's
// certificate names the server it meant (a certificate from the same CA for
// another host, or the client's own, is refused); a server may narrow the
// clients it accepts. Certificates carrying an extended key usage are held to
// it (serverAuth for servers, clientAuth for clients; OpenSSL's purpose check).
struct TlsConfig {
  bool enabled = false;
  // PEM files: this side's certificate chain and key, and the CA that must
  // have signed the peer's certificate.
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  // Client: the DNS name (matched against the certificate's DNS SANs,
  // wildcards of one whole label allowed) or IP address (matched against its
  // IP SANs) the server's certificate must hold. Empty: the host part of
  // the address dialled. The subject's CN is never consulted.
  std::string server_name;
  // Server: when not empty, a client's certificate must hold one of these
  // DNS names or IP addresses (as server_name); empty: any certificate the
  // CA signed. At most kMaxTlsNames.
  std::vector<std::string> client_names;
  // Both roles: when not empty, the peer's certificate (its DER encoding)
  // must have one of these SHA-256 fingerprints, checked in addition to the
  // CA. Written "sha256:" + 64 hex digits (':' between bytes allowed, as
  // `openssl x509 -fingerprint -sha256` prints them). At most kMaxTlsNames.
  std::vector<std::string> peer_sha256;
};
inline constexpr size_t kMaxTlsNames = 64;

struct TcpOptions {
  // Parallel streams per connection (1..max_streams). 0 = choose: from the
  // bandwidth-delay product when rate_bps_hint and rtt_us_hint are given,
  // else 8.
  uint32_t streams = 0;
  uint64_t rate_bps_hint = 0;
  uint64_t rtt_us_hint = 0;
  uint32_t max_streams = 64;
  // SO_SNDBUF/SO_RCVBUF per stream; 0 = leave the kernel's autotuning
  // (the default: a fixed size turns autotuning off and is capped by
  // net.core.wmem_max/rmem_max).
  uint64_t socket_buffer_bytes = 0;
  // TCP_NOTSENT_LOWAT per stream: a stream's socket takes new bytes only
  // while less than this is queued unsent, so a stream slowed by loss does
  // not sit on chunks (and the transfer window) that a faster stream could
  // send. 0 = the kernel's default (no limit).
  uint64_t notsent_lowat_bytes = 1ull << 20;
  // TCP_CONGESTION; when the kernel refuses it the default stays and
  // Connection::Describe() says which one is in use.
  std::string congestion = "bbr";
  TlsConfig tls;

  uint64_t connect_timeout_ms = 10000;
  // A peer must complete its hello (and TLS handshake) within this.
  uint64_t handshake_timeout_ms = 10000;
  // Once the first byte of a frame header arrived, the rest must follow
  // within this (slowloris).
  uint64_t header_timeout_ms = 10000;
  // No complete frame for this long closes the connection; live peers send
  // keepalives at a third of it.
  uint64_t idle_timeout_ms = 30000;
  // A frame being received must arrive at this rate at least: a frame of N
  // payload bytes gets header_timeout_ms + N / rate, then the connection is
  // closed with kTimeout (a peer trickling one byte per idle timeout would
  // otherwise hold a connection for ever). 0 disables. 64 KiB/s lets a 64
  // MiB chunk take 17 minutes on one stream.
  uint64_t min_frame_bytes_per_s = 64 * 1024;
  // Accepted connections open at once (incl. half-formed ones), per listener.
  uint32_t max_connections = 256;
  // Frames queued for sending per connection before SendMessage/SendChunk
  // fail with kResourceExhausted.
  uint32_t max_queued_frames = 4096;

  LogFn log;  // null: stderr
};

// Streams chosen for a link: ceil(BDP / per-stream window), clamped to
// [1, max_streams]; 8 without hints.
TERN_EXPORT uint32_t ChooseTcpStreams(const TcpOptions& options);

// Fails (kInvalidArgument / kIo) when TLS is enabled and the files do not
// load, or a name or fingerprint in TlsConfig is malformed.
TERN_EXPORT Result<std::unique_ptr<Transport>> NewTcpTransport(TcpOptions options,
                                                              Clock& clock = SteadyClock());

}  // namespace tern
