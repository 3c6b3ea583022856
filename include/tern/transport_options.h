// The options of every shipped backend, in one neutral header: the backend
// headers (tcp_transport.h, ucx_transport.h, verbs_transport.h) and the
// transport registry (transport_registry.h) share them, so that code choosing
// a backend by name fills them in without including a backend.
// Plain structs; each backend reads only its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tern/export.h"
#include "tern/transport.h"

namespace tern {

// ---- tcp (docs/transport.md) ----

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

// The longest idle or header timeout a TCP transport takes (one year):
// its deadlines are sums in microseconds, which must not wrap.
inline constexpr uint64_t kMaxTcpTimeoutMs = 365ull * 24 * 3600 * 1000;

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
  // within this (slowloris). At most kMaxTcpTimeoutMs, as idle_timeout_ms.
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
  // The TCP wire versions this side accepts (docs/format/tcp.md), within
  // 1..2. Version 2 carries a checksum of every control message's payload;
  // version 1 only of frame headers and chunks. A client offers
  // max_wire_version; refused by a server that speaks only an older one, it
  // dials again in that one unless it is below min_wire_version. A server
  // refuses a peer outside the range with a reason naming both. Set min 2
  // on links without TLS once every peer speaks it.
  uint32_t min_wire_version = 1;
  uint32_t max_wire_version = 2;

  LogFn log;  // null: stderr
};

// Streams the tcp backend uses for a link: TcpOptions::streams when set, else
// ceil(BDP / per-stream window) clamped to [1, max_streams]; 8 without hints.
TERN_EXPORT uint32_t ChooseTcpStreams(const TcpOptions& options);

// ---- ucx (docs/transport-rdma.md) ----

struct UcxOptions {
  // UCX_TLS / UCX_NET_DEVICES for this context; empty = UCX's defaults
  // (which the UCX_* environment variables may override).
  std::string tls;
  std::string net_devices;
  // UCX's peer-failure mode: a dead peer surfaces at once as a closed
  // connection, but UCX then uses only transports that can detect it (tcp,
  // InfiniBand/RoCE), and in UCX 1.13 not shared memory. Off, shared memory
  // (posix/sysv/cma) is used between processes of one host, and a dead peer
  // is noticed by op_timeout_ms instead. Client/server setup always needs
  // UCX's "tcp" connection manager in `tls` (e.g. "sm,self,tcp").
  bool detect_peer_failure = true;

  uint64_t connect_timeout_ms = 10000;
  // An accepted endpoint must send its hello within this.
  uint64_t handshake_timeout_ms = 10000;
  // A chunk or Write not acknowledged within this closes the connection
  // with kTimeout.
  uint64_t op_timeout_ms = 60000;
  // Accepted connections open at once (incl. half-formed ones), per transport.
  uint32_t max_connections = 256;
  // Messages, chunks and writes in flight per connection before
  // SendMessage/SendChunk/Write fail with kResourceExhausted.
  uint32_t max_queued_ops = 4096;
  // Bytes of inbound messages buffered per connection (rendezvous receives
  // plus messages waiting for an earlier one); beyond it the connection is
  // closed with kResourceExhausted.
  uint64_t max_inbound_bytes = uint64_t{256} << 20;

  LogFn log;  // null: stderr
};

// ---- verbs (docs/transport-rdma.md) ----

struct VerbsOptions {
  // The verbs library to load (softverbs' path in tests).
  std::string library = "libibverbs.so.1";
  // RDMA device and port; empty = the first device with an active port.
  std::string device;
  uint8_t port = 0;  // 0 = the first active port of that device
  // GID index for RoCE (which GID is RoCE v2 depends on the host's setup;
  // see `show_gids`). Ignored on InfiniBand.
  uint8_t gid_index = 0;

  // Receive buffers posted per connection (each 64 KiB + 56 bytes); the
  // peer's send credits.
  uint32_t recv_buffers = 32;
  // RDMA READs in flight per connection (chunks being pulled).
  uint32_t max_reads = 16;

  uint64_t connect_timeout_ms = 10000;
  uint64_t handshake_timeout_ms = 10000;
  // A chunk or Write not acknowledged within this closes the connection
  // with kTimeout.
  uint64_t op_timeout_ms = 60000;
  // Connections per transport, accepted or dialled, incl. half-formed ones.
  uint32_t max_connections = 256;
  // Messages, chunks and writes in flight per connection before
  // SendMessage/SendChunk/Write fail with kResourceExhausted.
  uint32_t max_queued_ops = 4096;

  LogFn log;  // null: stderr
};

}  // namespace tern
