// The agent's admin HTTP port: GET /metrics, GET /status, POST /publish and
// whatever else the daemon registers, plus the client side used by
// `tern status` and `tern publish` (docs/agent/operations.md).
//
// Server. cpp-httplib 0.11 (Debian's shared library) parses HTTP; it has no
// bound on the number of header lines or on one line's length and no
// deadline for a whole request, so it never faces the network directly:
// AdminServer accepts TCP itself and relays bytes (no parsing) to httplib
// listening on a Unix socket in a private 0700 directory, and that relay
// enforces
//  * at most max_connections connections at once: one more is answered
//    "503" and closed at once;
//  * at most max_head_bytes + the largest route's body limit bytes from a
//    client: over that, "413" and close (a backstop: the head checks below
//    refuse a declared Content-Length over the route's limit first);
//  * a deadline of request_timeout_ms from accept to the last response byte
//    (slowloris): "408" and close, or just close when the response had begun;
//  * one request per connection (keep-alive off).
// httplib refuses what it cannot parse (garbage, HTTP/0.9, a header line or
// URI over 8 KiB: both compiled into the library) with "400"/"414". Routes
// are exact paths (the query string is parsed into AdminRequest::params); a
// route marked `mutating` or `private_read` needs
// "Authorization: Bearer <token>" when AdminOptions::token is set ("401"
// otherwise; the comparison takes constant time). Every refusal has a
// one-line text body saying why. The server keeps serving after any of them.
//
// The head decides before any body byte is read (httplib's pre-routing
// handler, and its 100-continue handler for a client that sends
// "Expect: 100-continue" and waits): no such route "404"; a route that
// takes no body sent one, or a bad Content-Length "400"; the token "401";
// a Content-Encoding other than identity "415" (httplib would inflate gzip
// or brotli past any limit); a POST with neither Content-Length nor chunked
// framing "411"; a declared Content-Length over the route's body limit
// (AdminRoute::max_body_bytes, else AdminOptions::max_body_bytes) "413".
// A chunked body is cut at the limit as it is read ("413"). Such a refusal
// is answered and the connection closed with the body unread: the relay
// shuts its side and drops at most 1 MiB (500 ms) more so that the answer
// is not destroyed by a reset (docs/agent/operations.md says what a client
// that writes its whole body first sees). At most max_large_bodies bodies
// over AdminOptions::max_body_bytes are being read at once; another waits
// for a slot up to half the request deadline, then "503". A body read is
// held while its handler runs (one per worker thread).
//
// Handlers run on httplib's worker threads (`workers` of them, several at
// once): they must be thread-safe and return promptly (Stop waits for
// them). An exception from a handler becomes "500" with no detail sent.
//
// Lifetime: Start binds and serves on its own threads; Stop (also run by the
// destructor) closes the port, ends every open connection, waits for
// handlers in flight and removes the Unix socket; it is idempotent. Methods
// of one AdminServer may be called from any thread.
//
// TLS. With AdminOptions::tls_cert_pem the port speaks HTTPS only (TLS 1.2
// or newer, terminated by httplib's SSLServer behind the guard, which
// relays the encrypted bytes and bounds them as above). With
// AdminOptions::tls_client_ca_pem as well, a client must present a
// certificate signed by that CA (mutual TLS) before any HTTP is read; the
// token is still needed on the routes that need it. A client that
// speaks plain HTTP to it is answered, in plain text, "400 this port speaks
// TLS: use https://HOST:PORT" and closed; the guard's other refusals (503,
// 408, 413) cannot be read by a TLS client and close the connection
// instead (the log says why).
//
// Client. AdminGet/AdminPost make one request (the path may end in a query
// of plain characters: "/events?after=3") with a total timeout and a
// bound on the reply's size; a non-2xx answer is an error Status carrying
// the status code and the server's one-line reason (401/403 -> kAuth,
// 408 -> kTimeout, 413 -> kResourceExhausted, 404 -> kNotFound, other 4xx ->
// kInvalidArgument, 5xx -> kUnavailable); no answer is kUnavailable or
// kTimeout. The address is "HOST:PORT" or "http://HOST:PORT" (plain) or
// "https://HOST:PORT": TLS, the server's certificate verified by OpenSSL
// against AdminClientOptions::ca_pem (empty: the system's trust store) and
// its subjectAltName against HOST (agent/https/https_tls.h); a refused
// certificate is kAuth saying why. AdminClientOptions::cert_pem/key_pem is
// the client certificate a mutual-TLS port asks for; a port that refused
// ours (or wanted one and got none) is kAuth saying so. Thread-safe (no
// shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tern/log.h"
#include "tern/status.h"

namespace tern::agent {

struct AdminOptions {
  std::string address = "127.0.0.1:0";  // HOST:PORT (port 0: any; see address())
  std::string token;                    // empty: mutating routes need no token
  // Both or neither: the port speaks HTTPS with this certificate (the leaf,
  // then intermediates) and its unencrypted key.
  std::string tls_cert_pem, tls_key_pem;
  // With TLS: the CA(s) (PEM) a client's certificate must chain to; empty:
  // no client certificate asked for.
  std::string tls_client_ca_pem;
  uint32_t max_connections = 16;       // open at once (each has a relay thread)
  uint32_t workers = 4;                // httplib handler threads
  uint32_t max_head_bytes = 64 << 10;  // request line + headers
  uint32_t max_body_bytes = 1 << 20;   // a POST route's, unless the route says more
  uint32_t max_large_bodies = 2;       // bodies over max_body_bytes being read at once
  uint32_t request_timeout_ms = 10000;  // accept to last response byte
  uint32_t io_timeout_ms = 5000;        // httplib's per read/write wait
  std::string socket_dir;               // for the private Unix socket; empty: $TMPDIR or /tmp
  LogFn log;                            // refusals, one line each; null: stderr
};

inline constexpr size_t kMaxQueryParams = 16;

struct AdminRequest {
  std::string_view method;  // "GET" or "POST"
  std::string_view path;
  std::string_view body;  // <= the route's body limit
  // The query's parameters (?a=1&b=2), decoded: the first value of each
  // name, at most kMaxQueryParams names (the URI is at most 8 KiB).
  std::map<std::string, std::string> params;
};

struct AdminResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

using AdminHandler = std::function<AdminResponse(const AdminRequest&)>;

// The HTTP status a route answers a failed call with, so that the client
// (AdminGet/AdminPost) maps it back to a code: 404 kNotFound, 403 kAuth,
// 409 for a request that cannot be done as asked (kInvalidArgument,
// kOutOfRange, kMismatch, kAlreadyExists: the client's kInvalidArgument),
// 503 kUnavailable, else 500.
int AdminHttpStatusOf(const Status& s);

struct AdminRoute {
  std::string method;  // "GET" or "POST"
  std::string path;    // exact match, e.g. "/status"
  AdminHandler handler;
  bool mutating = false;  // needs the bearer token when one is set
  // Changes nothing but tells what a scheduler should ask for with the
  // token (GET /events: slot paths, tensor names): needs it too.
  bool private_read = false;
  // POST only: the largest body (0: AdminOptions::max_body_bytes; at most
  // kMaxAdminBodyBytes). More than AdminOptions::max_body_bytes makes this a
  // large-body route, bounded by max_large_bodies.
  uint32_t max_body_bytes = 0;
};

inline constexpr uint32_t kMaxAdminBodyBytes = uint32_t{256} << 20;

// What the server has done since Start (tests and measurements).
struct AdminCounters {
  uint64_t client_bytes_read = 0;  // every byte read from clients (relayed or dropped)
  uint64_t body_bytes_read = 0;    // request body bytes handed to routes
  uint64_t refused_from_head = 0;  // requests answered before any body byte was read
  uint32_t large_bodies_peak = 0;  // the most large bodies being read at once
  // Client connections being relayed now. A closed connection's bytes may
  // still be counting (a lingering close drops what the client had sent)
  // until it leaves this count.
  uint32_t connections_open = 0;
};

class AdminServer {
 public:
  // Checks options and routes (kInvalidArgument), binds (kIo with the
  // address on failure), starts serving.
  static Result<std::unique_ptr<AdminServer>> Start(AdminOptions options,
                                                    std::vector<AdminRoute> routes);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  std::string address() const;  // the bound "HOST:PORT" (the real port)
  AdminCounters counters() const;
  void Stop();

  struct Impl;

 private:
  explicit AdminServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The route GET /metrics serving render() as Prometheus text
// (e.g. [&registry] { return registry.Render(); }).
AdminRoute MetricsRoute(std::function<std::string()> render);

struct AdminClientOptions {
  std::string token;  // sent as "Authorization: Bearer <token>" when set
  // https:// addresses: the CA(s) that signed the admin port's certificate
  // (PEM); empty: the system's trust store.
  std::string ca_pem;
  // https:// addresses: our certificate and its unencrypted key (PEM), for
  // a port that requires one (AdminOptions::tls_client_ca_pem); both or
  // neither.
  std::string cert_pem, key_pem;
  uint32_t timeout_ms = 10000;
  uint64_t max_reply_bytes = 16 << 20;
  std::string content_type = "application/json";  // of a POST's body
};

// An admin address split: "HOST:PORT", "http://HOST:PORT" or
// "https://HOST:PORT" (nothing after the port). kInvalidArgument otherwise.
struct AdminTarget {
  bool tls = false;
  std::string host;
  uint16_t port = 0;
};
Result<AdminTarget> ParseAdminAddress(std::string_view address);

// The reply body of a 2xx answer. `path` may carry a query
// ("/events?after=3&max=8": letters, digits, '_', '=' and '&').
Result<std::string> AdminGet(std::string_view address, std::string_view path,
                             const AdminClientOptions& options = {});
Result<std::string> AdminPost(std::string_view address, std::string_view path,
                              std::string_view json_body, const AdminClientOptions& options = {});

}  // namespace tern::agent
