// The etcd client: JSON over cpp-httplib to etcd's gateway (agent/etcd/etcd.h,
// docs/agent/etcd.md). Everything the peer sends is untrusted: bounded body,
// checked types, strict base64.
#include "agent/etcd/etcd.h"

#include <httplib.h>
#include <openssl/err.h>

#include <nlohmann/json.hpp>

#include <optional>

#include "agent/etcd/etcd_json.h"
#include "agent/https/https_tls.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/text.h"

namespace tern::agent {
namespace {

using nlohmann::json;

constexpr size_t kMaxTxnCompares = 64;
constexpr size_t kMaxTxnOps = 64;
constexpr uint32_t kMaxRangeLimit = 100'000;
constexpr size_t kMaxEndpoints = 16;
constexpr size_t kMaxUserBytes = 256;
constexpr size_t kMaxPasswordBytes = 4096;
constexpr int64_t kGrpcUnauthenticated = 16;

struct Endpoint {
  std::string host;
  int port = 0;
  bool tls = false;  // https://
};

Result<Endpoint> ParseEndpoint(const std::string& text) {
  std::string rest = text;
  bool tls = false;
  if (rest.rfind("http://", 0) == 0) {
    rest = rest.substr(7);
  } else if (rest.rfind("https://", 0) == 0) {
    rest = rest.substr(8);
    tls = true;
  }
  TERN_REQUIRE(rest.find("://") == std::string::npos, kUnsupported, "etcd endpoint '",
               Printable(text), "': only http:// and https:// are supported");
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  auto address = ParseHostPort(rest);
  TERN_REQUIRE(address.ok(), kInvalidArgument, "etcd endpoint '", Printable(text),
               "': want host:port (", address.status().message(), ")");
  TERN_REQUIRE(address->port >= 1, kInvalidArgument, "etcd endpoint '", Printable(text),
               "': port 0");
  return Endpoint{std::move(address->host), address->port, tls};
}

// The one place the client's security rule lives (docs/agent/etcd.md §1,
// "Security"): off loopback, TLS and some authentication, unless insecure.
Status CheckEndpointSecurity(const Endpoint& ep, const EtcdOptions& o) {
  const std::string name = FormatHostPort({ep.host, static_cast<uint16_t>(ep.port)});
  const bool tls_material = !o.ca_pem.empty() || !o.cert_pem.empty() || !o.key_pem.empty();
  TERN_REQUIRE(ep.tls || !tls_material, kInvalidArgument, "etcd endpoint ", name,
               " is plain http but TLS files were given (--etcd-cacert/--etcd-cert/--etcd-key): "
               "use https:// (etcds:// in a board URL)");
  if (o.insecure || IsLoopbackHost(ep.host)) return Status::Ok();
  TERN_REQUIRE(ep.tls, kInvalidArgument, "etcd endpoint ", name,
               " is plain http off loopback: anyone on the path could read and rewrite the board "
               "or hold the leader key; use TLS (https://, etcds:// in a board URL) or say "
               "--etcd-insecure");
  TERN_REQUIRE(!o.cert_pem.empty() || !o.user.empty(), kInvalidArgument, "etcd endpoint ", name,
               " is off loopback and this client does not authenticate: anyone who reaches etcd "
               "could do what it does; give a client certificate (--etcd-cert, --etcd-key) or an "
               "etcd user (--etcd-user, --etcd-password-file), or say --etcd-insecure");
  return Status::Ok();
}

// What etcd's gateway answers, with its HTTP status 400, to a client
// certificate that has a Common Name while etcd's auth is enabled (etcd 3.4
// refuses CN-based identities through the gateway).
constexpr std::string_view kGatewayCommonName = "CommonName of client sending a request";

// An auth token goes into a header: printable, no space, bounded.
bool ValidToken(const std::string& token) {
  if (token.empty() || token.size() > 4096) return false;
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

Status CheckKey(const std::string& key) {
  TERN_REQUIRE(!key.empty(), kInvalidArgument, "etcd: empty key");
  TERN_REQUIRE(key.size() <= kEtcdMaxKeyBytes, kInvalidArgument, "etcd: key of ", key.size(),
               " bytes (max ", kEtcdMaxKeyBytes, ")");
  return Status::Ok();
}

Status CheckValue(const std::string& value) {
  TERN_REQUIRE(value.size() <= kEtcdMaxValueBytes, kInvalidArgument, "etcd: value of ",
               value.size(), " bytes (max ", kEtcdMaxValueBytes, ")");
  return Status::Ok();
}

// gRPC status codes (as the gateway reports them) to tern codes.
Code CodeFromGrpc(int64_t grpc) {
  switch (grpc) {
    case 3:
      return Code::kInvalidArgument;
    case 5:
      return Code::kNotFound;
    case 6:
      return Code::kAlreadyExists;
    case 7:
    case 16:
      return Code::kAuth;
    case 8:
      return Code::kResourceExhausted;
    case 9:
      return Code::kMismatch;
    case 11:
      return Code::kOutOfRange;  // e.g. a compacted revision
    case 12:
      return Code::kUnsupported;
    case 1:
      return Code::kCancelled;
    case 4:
    case 10:
    case 14:
      return Code::kUnavailable;
    default:
      return Code::kInternal;
  }
}

const char* CompareTarget(EtcdCompare::Target t) {
  switch (t) {
    case EtcdCompare::Target::kValue:
      return "VALUE";
    case EtcdCompare::Target::kCreateRevision:
      return "CREATE";
    case EtcdCompare::Target::kModRevision:
      return "MOD";
    case EtcdCompare::Target::kVersion:
      return "VERSION";
    case EtcdCompare::Target::kLease:
      return "LEASE";
  }
  return "VALUE";
}

const char* CompareField(EtcdCompare::Target t) {
  switch (t) {
    case EtcdCompare::Target::kValue:
      return "value";
    case EtcdCompare::Target::kCreateRevision:
      return "create_revision";
    case EtcdCompare::Target::kModRevision:
      return "mod_revision";
    case EtcdCompare::Target::kVersion:
      return "version";
    case EtcdCompare::Target::kLease:
      return "lease";
  }
  return "value";
}

const char* CompareOp(EtcdCompare::Op op) {
  switch (op) {
    case EtcdCompare::Op::kEqual:
      return "EQUAL";
    case EtcdCompare::Op::kNotEqual:
      return "NOT_EQUAL";
    case EtcdCompare::Op::kGreater:
      return "GREATER";
    case EtcdCompare::Op::kLess:
      return "LESS";
  }
  return "EQUAL";
}

Result<json> OpJson(const EtcdOp& op) {
  TERN_RETURN_IF_ERROR(CheckKey(op.key));
  switch (op.type) {
    case EtcdOp::Type::kPut: {
      TERN_RETURN_IF_ERROR(CheckValue(op.value));
      json put = {{"key", Base64Encode(op.key)}, {"value", Base64Encode(op.value)}};
      if (op.lease != 0) put["lease"] = std::to_string(op.lease);
      return json{{"request_put", std::move(put)}};
    }
    case EtcdOp::Type::kGet:
      return json{{"request_range", {{"key", Base64Encode(op.key)}}}};
    case EtcdOp::Type::kDelete: {
      json del = {{"key", Base64Encode(op.key)}};
      if (!op.range_end.empty()) {
        TERN_RETURN_IF_ERROR(CheckKey(op.range_end));
        del["range_end"] = Base64Encode(op.range_end);
      }
      return json{{"request_delete_range", std::move(del)}};
    }
  }
  return TERN_ERROR(kInvalidArgument, "etcd: unknown op type");
}

}  // namespace

struct EtcdClient::Impl {
  EtcdOptions options;  // constant after Create
  std::vector<Endpoint> endpoints;
  std::unique_ptr<HttpsClientTls> tls;  // with an https endpoint; constant after Create
  Mutex mu;
  size_t current GUARDED_BY(mu) = 0;
  std::unique_ptr<httplib::ClientImpl> client GUARDED_BY(mu);  // null: reconnect
  // etcd's auth token for options.user (empty: authenticate first). A
  // secret: never logged.
  std::string token GUARDED_BY(mu);

  // POSTs `request` to `path` as options.user (authenticating first when
  // there is no token, and once more when etcd says the token is invalid:
  // it expired or was revoked; etcd checks the token before anything else,
  // so the refused request did nothing and may be sent again).
  Result<json> Call(const std::string& path, const json& request) {
    MutexLock lock(mu);
    const std::string body = request.dump();
    if (options.user.empty()) return Send(path, body, /*with_token=*/false);
    if (token.empty()) TERN_RETURN_IF_ERROR(Authenticate());
    bool invalid_token = false;
    auto reply = Send(path, body, /*with_token=*/true, &invalid_token);
    if (!invalid_token) return reply;
    LogLine(options.log, "etcd: the auth token of user '" + Printable(options.user) +
                             "' is no longer valid (expired or revoked); authenticating again");
    token.clear();
    TERN_RETURN_IF_ERROR(Authenticate());
    return Send(path, body, /*with_token=*/true);
  }

  // POST /v3/auth/authenticate {name, password} -> token.
  Status Authenticate() REQUIRES(mu) {
    const json request = {{"name", options.user}, {"password", options.password}};
    auto reply = Send("/v3/auth/authenticate", request.dump(), /*with_token=*/false);
    if (!reply.ok()) {
      return reply.status().WithContext("etcd: authenticating as user '" +
                                        Printable(options.user) + "'");
    }
    const json* t = reply->contains("token") ? &(*reply)["token"] : nullptr;
    TERN_REQUIRE(t != nullptr && t->is_string() && ValidToken(t->get<std::string>()), kProtocol,
                 "etcd: authenticating as user '", Printable(options.user),
                 "': the reply has no usable token");
    token = t->get<std::string>();
    return Status::Ok();
  }

  // The client for the current endpoint, made on first use.
  Result<httplib::ClientImpl*> Connection() REQUIRES(mu) {
    if (client != nullptr) return client.get();
    const Endpoint& ep = endpoints[current];
    if (ep.tls) {
      auto made = tls->Connect(ep.host, ep.port);
      if (!made.ok()) return std::move(made).take_status();
      client = std::move(*made);
    } else {
      client = std::make_unique<httplib::ClientImpl>(ep.host, ep.port);
    }
    const time_t s = options.timeout_ms / 1000;
    const time_t us = (options.timeout_ms % 1000) * 1000;
    client->set_connection_timeout(s, us);
    client->set_read_timeout(s, us);
    client->set_write_timeout(s, us);
    client->set_keep_alive(true);
    return client.get();
  }

  // Why a request to `ep` failed before a reply came: the cause in words,
  // and whether it is a refusal of who we are (kAuth) rather than a
  // connection that may work next time (kUnavailable).
  Status ConnectionError(const Endpoint& ep, const std::string& where, httplib::Error err,
                         const std::string& tls_detail) const {
    const std::string detail = tls_detail.empty() ? "" : " (" + Printable(tls_detail) + ")";
    if (err == httplib::Error::SSLServerVerification) {
      return TERN_ERROR(kAuth, "etcd ", where, ": etcd's TLS certificate was refused",
                        tls_detail.empty() ? " (it does not name " + ep.host + ")" : detail,
                        tls->has_ca() ? ": it must chain to the CA given (--etcd-cacert)"
                                      : ": it must chain to the system's trust store (or give "
                                        "etcd's CA with --etcd-cacert)",
                        " and name ", ep.host, " in its subjectAltName");
    }
    // Alerts that say etcd refused our certificate, or the lack of one.
    const bool refused_us = IsTlsCertificateAlert(tls_detail);
    if (ep.tls && refused_us) {
      return TERN_ERROR(kAuth, "etcd ", where, ": etcd refused the TLS handshake", detail,
                        tls->has_client_cert()
                            ? ": etcd does not accept our client certificate (--etcd-cert): is it "
                              "signed by a CA in etcd's --trusted-ca-file?"
                            : ": etcd wants a client certificate (--client-cert-auth): give "
                              "--etcd-cert and --etcd-key",
                        // Also what a TLS 1.2 peer sends when no cipher
                        // suite is shared: say so rather than guess.
                        tls_detail.find("handshake failure") != std::string::npos
                            ? " (or etcd shares no cipher suite with this client)"
                            : "");
    }
    std::string hint;
    if (ep.tls && err == httplib::Error::SSLConnection) {
      hint = "; is this an https endpoint? (a plain etcd wants http://, etcd:// in a board URL)";
      if (!tls->has_client_cert()) hint += "; or etcd wants a client certificate (--etcd-cert)";
    } else if (!ep.tls && (err == httplib::Error::Read || err == httplib::Error::Write)) {
      // etcd's TLS port closes a plain connection without a word.
      hint = "; the connection closed without an HTTP reply: if etcd serves TLS on this port, "
             "use https:// (etcds:// in a board URL)";
    } else if (ep.tls && (err == httplib::Error::Read || err == httplib::Error::Write)) {
      // TLS 1.3: etcd checks our certificate after our side of the
      // handshake is done, so its refusal may show as a failed write (the
      // alert unread) or read.
      hint = tls->has_client_cert()
                 ? "; etcd closed the connection: it may not accept our client certificate "
                   "(--etcd-cert: signed by a CA in etcd's --trusted-ca-file?)"
                 : "; etcd closed the connection: it may want a client certificate "
                   "(--client-cert-auth): give --etcd-cert and --etcd-key";
    }
    return TERN_ERROR(kUnavailable, "etcd ", where, ": ", httplib::to_string(err), detail, hint);
  }

  // An error etcd sent (gRPC code and message), with what it means for us.
  Status EtcdError(const std::string& where, int64_t grpc, const std::string& message) const {
    const std::string said = Printable(message.substr(0, 200));
    const std::string user = Printable(options.user);
    std::string hint;
    Code code = CodeFromGrpc(grpc);
    if (message.find("invalid user ID or password") != std::string::npos) {
      code = Code::kAuth;
      hint = ": wrong user or password (--etcd-user, --etcd-password-file)";
    } else if (message.find("user name is empty") != std::string::npos) {
      code = Code::kAuth;
      hint = ": etcd's auth is enabled and we gave no user: give --etcd-user and "
             "--etcd-password-file";
    } else if (message.find("authentication is not enabled") != std::string::npos) {
      code = Code::kAuth;
      hint = ": user '" + user + "' given, but etcd does not check users (enable auth in etcd, "
             "or give no --etcd-user)";
    } else if (message.find("permission denied") != std::string::npos) {
      code = Code::kAuth;
      hint = options.user.empty()
                 ? ": we gave no etcd user"
                 : ": user '" + user + "' has no permission on these keys (grant its role "
                   "readwrite on the board's prefix)";
    }
    return Status(code, internal::Where(__FILE__, __LINE__) + "etcd " + where + ": " + said + hint);
  }

  // One POST and its reply: the parsed JSON object of a 200 response, or the
  // error etcd or the connection gave. *invalid_token: etcd refused our
  // token (the caller authenticates again).
  Result<json> Send(const std::string& path, const std::string& request_body, bool with_token,
                    bool* invalid_token = nullptr) REQUIRES(mu) {
    const Endpoint& ep = endpoints[current];
    const std::string where = FormatHostPort({ep.host, static_cast<uint16_t>(ep.port)}) + path;
    auto connection = Connection();
    if (!connection.ok()) return std::move(connection).take_status();
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = request_body;
    req.set_header("Content-Type", "application/json");
    if (with_token) req.set_header("Authorization", token);
    std::string body;
    bool too_big = false;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (body.size() + n > options.max_response_bytes) {
        too_big = true;
        return false;
      }
      body.append(data, n);
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    if (ep.tls) ERR_clear_error();  // what is queued after send is this request's
    const bool sent = (*connection)->send(req, res, err);
    if (too_big) {
      client.reset();
      return TERN_ERROR(kProtocol, "etcd ", where, ": response over ", options.max_response_bytes,
                        " bytes");
    }
    json reply = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!sent) {
      // The gateway ends an error reply with an HTTP trailer, which
      // cpp-httplib 0.11 cannot parse (Error::Read after the whole body).
      // A complete JSON body after the status line is still the reply; the
      // connection is dropped either way.
      bool server_refused = false;
      const std::string tls_detail = ep.tls ? HttpsClientTls::HandshakeError(&server_refused) : "";
      // OpenSSL refused etcd's certificate during the handshake.
      if (server_refused) err = httplib::Error::SSLServerVerification;
      client.reset();
      if (err != httplib::Error::Read || res.status <= 0 || !reply.is_object()) {
        Status why = ConnectionError(ep, where, err, tls_detail);
        // Try the next endpoint on the next call.
        current = (current + 1) % endpoints.size();
        if (endpoints.size() > 1) {
          LogLine(options.log, "etcd: " + where + ": " + httplib::to_string(err) +
                                   "; next request goes to " + endpoints[current].host + ":" +
                                   std::to_string(endpoints[current].port));
        }
        return why;
      }
    }
    if (!reply.is_object()) {
      if (res.status == 400 && body.find(kGatewayCommonName) != std::string::npos) {
        return TERN_ERROR(kAuth, "etcd ", where,
                          ": etcd's gateway refuses a client certificate with a Common Name while "
                          "etcd's auth is enabled: issue the client certificate (--etcd-cert) "
                          "without a CN (subjectAltName only)");
      }
      return TERN_ERROR(kProtocol, "etcd ", where, ": HTTP ", res.status,
                        ", not a JSON object: ", Printable(body.substr(0, 120)));
    }
    if (reply.contains("error")) {
      // Unary errors: {"error": "...", "code": N}; streaming ones (keepalive):
      // {"error": {"grpc_code": N, "message": "..."}}.
      const json& e = reply["error"];
      std::string message;
      int64_t code = -1;
      if (e.is_string()) {
        message = e.get<std::string>();
        if (reply.contains("code") && reply["code"].is_number_integer()) {
          code = reply["code"].get<int64_t>();
        }
      } else if (e.is_object()) {
        if (e.contains("message") && e["message"].is_string()) message = e["message"];
        if (e.contains("grpc_code") && e["grpc_code"].is_number_integer()) code = e["grpc_code"];
      }
      if (invalid_token != nullptr && code == kGrpcUnauthenticated &&
          message.find("invalid auth token") != std::string::npos) {
        *invalid_token = true;
      }
      return EtcdError(where, code, message);
    }
    if (res.status != 200) {
      return TERN_ERROR(kProtocol, "etcd ", where, ": HTTP ", res.status);
    }
    return reply;
  }

  ~Impl() {
    std::optional<SigpipeBlock> quiet;
    if (tls != nullptr) quiet.emplace();  // closing a TLS connection writes
    MutexLock lock(mu);
    client.reset();
  }

  // Call with a last line of defence: a library exception becomes a Status.
  Result<json> SafeCall(const std::string& path, const json& request) {
    std::optional<SigpipeBlock> quiet;
    if (tls != nullptr) quiet.emplace();
    try {
      return Call(path, request);
    } catch (const std::exception& e) {
      MutexLock lock(mu);
      client.reset();
      return TERN_ERROR(kInternal, "etcd ", path, ": ", Printable(e.what()));
    }
  }
};

// "\0" when no key is above them all: the whole key space from prefix on.
std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty() && static_cast<uint8_t>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return std::string(1, '\0');
  end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
  return end;
}

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  TERN_REQUIRE(!options.endpoints.empty(), kInvalidArgument, "etcd: no endpoints");
  TERN_REQUIRE(options.endpoints.size() <= kMaxEndpoints, kInvalidArgument,
               "etcd: ", options.endpoints.size(), " endpoints (max ", kMaxEndpoints, ")");
  TERN_REQUIRE(options.timeout_ms >= 1 && options.timeout_ms <= 600'000, kInvalidArgument,
               "etcd: timeout_ms ", options.timeout_ms, " not in 1..600000");
  TERN_REQUIRE(options.max_response_bytes >= 4096, kInvalidArgument,
               "etcd: max_response_bytes below 4096");
  TERN_REQUIRE(options.user.empty() == options.password.empty(), kInvalidArgument,
               "etcd: give both a user and a password (--etcd-user, --etcd-password-file), or "
               "neither");
  TERN_REQUIRE(options.user.size() <= kMaxUserBytes && IsPrintable(options.user),
               kInvalidArgument, "etcd: user name of ", options.user.size(),
               " bytes or with unprintable bytes (max ", kMaxUserBytes, ")");
  TERN_REQUIRE(options.password.size() <= kMaxPasswordBytes, kInvalidArgument,
               "etcd: password of over ", kMaxPasswordBytes, " bytes");
  auto impl = std::make_unique<Impl>();
  bool any_tls = false;
  for (const std::string& text : options.endpoints) {
    auto ep = ParseEndpoint(text);
    if (!ep.ok()) return std::move(ep).take_status();
    TERN_RETURN_IF_ERROR(CheckEndpointSecurity(*ep, options));
    any_tls = any_tls || ep->tls;
    if (!ep->tls && !options.user.empty() && !IsLoopbackHost(ep->host)) {
      LogLine(options.log, "etcd: WARNING: the password of etcd user '" +
                               Printable(options.user) + "' travels in clear to " + text +
                               " (--etcd-insecure)");
    }
    impl->endpoints.push_back(std::move(*ep));
  }
  if (any_tls) {
    auto tls = HttpsClientTls::Create(options.ca_pem, options.cert_pem, options.key_pem,
                                      {"etcd TLS", "--etcd-cacert", "--etcd-cert", "--etcd-key"});
    if (!tls.ok()) return std::move(tls).take_status();
    impl->tls = std::move(*tls);
  }
  impl->options = std::move(options);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

Result<int64_t> EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  TERN_RETURN_IF_ERROR(CheckKey(key));
  TERN_RETURN_IF_ERROR(CheckValue(value));
  json req = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  auto reply = impl_->SafeCall("/v3/kv/put", req);
  if (!reply.ok()) return std::move(reply).take_status();
  return HeaderRevision(*reply);
}

Result<EtcdRange> EtcdClient::Get(const std::string& key) {
  TERN_RETURN_IF_ERROR(CheckKey(key));
  auto reply = impl_->SafeCall("/v3/kv/range", json{{"key", Base64Encode(key)}});
  if (!reply.ok()) return std::move(reply).take_status();
  auto range = ParseRange(*reply, /*max_kvs=*/1);
  if (range.ok() && !range->kvs.empty()) {
    TERN_REQUIRE(range->kvs[0].key == key, kProtocol, "etcd: asked for '", Printable(key),
                 "', got '", Printable(range->kvs[0].key), "'");
  }
  return range;
}

Result<EtcdRange> EtcdClient::GetPrefix(const std::string& prefix, uint32_t limit,
                                        const std::string& start_key, int64_t revision) {
  TERN_RETURN_IF_ERROR(CheckKey(prefix));
  TERN_REQUIRE(limit >= 1 && limit <= kMaxRangeLimit, kInvalidArgument, "etcd: range limit ", limit,
               " not in 1..", kMaxRangeLimit);
  TERN_REQUIRE(start_key.empty() || start_key.rfind(prefix, 0) == 0, kInvalidArgument,
               "etcd: start key outside the prefix");
  TERN_REQUIRE(revision >= 0, kInvalidArgument, "etcd: negative revision");
  const std::string& from = start_key.empty() ? prefix : start_key;
  TERN_RETURN_IF_ERROR(CheckKey(from));
  json req = {{"key", Base64Encode(from)},
              {"range_end", Base64Encode(PrefixEnd(prefix))},
              {"limit", std::to_string(limit)}};
  if (revision != 0) req["revision"] = std::to_string(revision);
  auto reply = impl_->SafeCall("/v3/kv/range", req);
  if (!reply.ok()) return std::move(reply).take_status();
  auto range = ParseRange(*reply, limit);
  if (!range.ok()) return range;
  for (const EtcdKeyValue& kv : range->kvs) {
    TERN_REQUIRE(kv.key.rfind(prefix, 0) == 0 && kv.key >= from, kProtocol,
                 "etcd: range returned key '", Printable(kv.key), "' outside what was asked");
  }
  return range;
}

Result<int64_t> EtcdClient::Delete(const std::string& key) {
  TERN_RETURN_IF_ERROR(CheckKey(key));
  auto reply = impl_->SafeCall("/v3/kv/deleterange", json{{"key", Base64Encode(key)}});
  if (!reply.ok()) return std::move(reply).take_status();
  return Int64Field(*reply, "deleted");
}

Result<int64_t> EtcdClient::DeletePrefix(const std::string& prefix) {
  TERN_RETURN_IF_ERROR(CheckKey(prefix));
  json req = {{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(PrefixEnd(prefix))}};
  auto reply = impl_->SafeCall("/v3/kv/deleterange", req);
  if (!reply.ok()) return std::move(reply).take_status();
  return Int64Field(*reply, "deleted");
}

Result<EtcdTxnResult> EtcdClient::Txn(const std::vector<EtcdCompare>& compares,
                                      const std::vector<EtcdOp>& success,
                                      const std::vector<EtcdOp>& failure) {
  TERN_REQUIRE(compares.size() <= kMaxTxnCompares && success.size() <= kMaxTxnOps &&
                   failure.size() <= kMaxTxnOps,
               kInvalidArgument, "etcd: txn over ", kMaxTxnCompares, " compares or ", kMaxTxnOps,
               " ops per branch");
  json req = json::object();
  json cmp = json::array();
  for (const EtcdCompare& c : compares) {
    TERN_RETURN_IF_ERROR(CheckKey(c.key));
    json j = {{"key", Base64Encode(c.key)},
              {"result", CompareOp(c.op)},
              {"target", CompareTarget(c.target)}};
    if (c.target == EtcdCompare::Target::kValue) {
      TERN_RETURN_IF_ERROR(CheckValue(c.value));
      j["value"] = Base64Encode(c.value);
    } else {
      j[CompareField(c.target)] = std::to_string(c.number);
    }
    cmp.push_back(std::move(j));
  }
  req["compare"] = std::move(cmp);
  for (const auto& [name, ops] : {std::pair{"success", &success}, std::pair{"failure", &failure}}) {
    json list = json::array();
    for (const EtcdOp& op : *ops) {
      auto j = OpJson(op);
      if (!j.ok()) return std::move(j).take_status();
      list.push_back(std::move(*j));
    }
    req[name] = std::move(list);
  }
  auto reply = impl_->SafeCall("/v3/kv/txn", req);
  if (!reply.ok()) return std::move(reply).take_status();
  auto succeeded = BoolField(*reply, "succeeded");
  if (!succeeded.ok()) return std::move(succeeded).take_status();
  const std::vector<EtcdOp>& ran = *succeeded ? success : failure;
  EtcdTxnResult result;
  result.succeeded = *succeeded;
  auto revision = HeaderRevision(*reply);
  if (!revision.ok()) return std::move(revision).take_status();
  result.revision = *revision;
  const json* responses = nullptr;
  if (reply->contains("responses")) responses = &(*reply)["responses"];
  const size_t count = responses ? (responses->is_array() ? responses->size() : SIZE_MAX) : 0;
  TERN_REQUIRE(count == ran.size(), kProtocol, "etcd txn: ", count == SIZE_MAX ? 0 : count,
               " responses for ", ran.size(), " ops");
  for (size_t i = 0; i < ran.size(); ++i) {
    if (ran[i].type != EtcdOp::Type::kGet) continue;
    const json& r = (*responses)[i];
    TERN_REQUIRE(r.is_object() && r.contains("response_range") && r["response_range"].is_object(),
                 kProtocol, "etcd txn: response ", i, " is not a range");
    auto range = ParseRange(r["response_range"], 1);
    if (!range.ok()) return std::move(range).take_status();
    result.gets.push_back(std::move(*range));
  }
  return result;
}

Result<EtcdClient::Lease> EtcdClient::LeaseGrant(int64_t ttl_s) {
  TERN_REQUIRE(ttl_s >= 1 && ttl_s <= kEtcdMaxLeaseTtlS, kInvalidArgument, "etcd: lease TTL ",
               ttl_s, " s not in 1..", kEtcdMaxLeaseTtlS);
  auto reply = impl_->SafeCall("/v3/lease/grant", json{{"TTL", std::to_string(ttl_s)}});
  if (!reply.ok()) return std::move(reply).take_status();
  auto id = Int64Field(*reply, "ID");
  if (!id.ok()) return std::move(id).take_status();
  auto ttl = Int64Field(*reply, "TTL");
  if (!ttl.ok()) return std::move(ttl).take_status();
  TERN_REQUIRE(*id != 0 && *ttl >= 1, kProtocol, "etcd: lease grant returned ID ", *id, " TTL ",
               *ttl);
  return Lease{*id, *ttl};
}

Result<int64_t> EtcdClient::LeaseKeepAlive(int64_t id) {
  TERN_REQUIRE(id != 0, kInvalidArgument, "etcd: lease 0");
  auto reply = impl_->SafeCall("/v3/lease/keepalive", json{{"ID", std::to_string(id)}});
  if (!reply.ok()) return std::move(reply).take_status();
  // A stream of one message: {"result": {..., "TTL": n}}; an expired lease
  // comes back with TTL 0 (omitted).
  TERN_REQUIRE(reply->contains("result") && (*reply)["result"].is_object(), kProtocol,
               "etcd: keepalive reply without a result");
  auto ttl = Int64Field((*reply)["result"], "TTL");
  if (!ttl.ok()) return std::move(ttl).take_status();
  TERN_REQUIRE(*ttl > 0, kNotFound, "etcd: lease ", id, " expired");
  return *ttl;
}

Status EtcdClient::LeaseRevoke(int64_t id) {
  TERN_REQUIRE(id != 0, kInvalidArgument, "etcd: lease 0");
  auto reply = impl_->SafeCall("/v3/lease/revoke", json{{"ID", std::to_string(id)}});
  return reply.ok() ? Status::Ok() : std::move(reply).take_status();
}

}  // namespace tern::agent
