// The etcd client: JSON over cpp-httplib to etcd's gateway (agent/etcd/etcd.h,
// docs/agent/etcd.md). Everything the peer sends is untrusted: bounded body,
// checked types, strict base64.
#include "agent/etcd/etcd.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "agent/etcd/etcd_json.h"
#include "base/log.h"
#include "base/text.h"

namespace tern::agent {
namespace {

using nlohmann::json;

constexpr size_t kMaxTxnCompares = 64;
constexpr size_t kMaxTxnOps = 64;
constexpr uint32_t kMaxRangeLimit = 100'000;
constexpr size_t kMaxEndpoints = 16;

struct Endpoint {
  std::string host;
  int port = 0;
};

Result<Endpoint> ParseEndpoint(const std::string& text) {
  std::string rest = text;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  TERN_REQUIRE(rest.find("://") == std::string::npos, kUnsupported, "etcd endpoint '",
               Printable(text), "': only http:// is supported");
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  auto address = ParseHostPort(rest);
  TERN_REQUIRE(address.ok(), kInvalidArgument, "etcd endpoint '", Printable(text),
               "': want host:port (", address.status().message(), ")");
  TERN_REQUIRE(address->port >= 1, kInvalidArgument, "etcd endpoint '", Printable(text),
               "': port 0");
  return Endpoint{std::move(address->host), address->port};
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
  EtcdOptions options;
  std::vector<Endpoint> endpoints;
  std::mutex mu;
  size_t current = 0;                       // guarded by mu
  std::unique_ptr<httplib::Client> client;  // guarded by mu; null: reconnect

  // POSTs `body` to `path` and returns the parsed JSON object of a 200
  // response, or the error etcd or the connection gave.
  Result<json> Call(const std::string& path, const json& request) {
    std::lock_guard<std::mutex> lock(mu);
    const Endpoint& ep = endpoints[current];
    const std::string where = ep.host + ":" + std::to_string(ep.port) + path;
    if (client == nullptr) {
      client = std::make_unique<httplib::Client>(ep.host, ep.port);
      const time_t s = options.timeout_ms / 1000;
      const time_t us = (options.timeout_ms % 1000) * 1000;
      client->set_connection_timeout(s, us);
      client->set_read_timeout(s, us);
      client->set_write_timeout(s, us);
      client->set_keep_alive(true);
    }
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = request.dump();
    req.set_header("Content-Type", "application/json");
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
    const bool sent = client->send(req, res, err);
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
      client.reset();
      if (err != httplib::Error::Read || res.status <= 0 || !reply.is_object()) {
        // Try the next endpoint on the next call.
        current = (current + 1) % endpoints.size();
        if (endpoints.size() > 1) {
          LogLine(options.log, "etcd: " + where + ": " + httplib::to_string(err) +
                                   "; next request goes to " + endpoints[current].host + ":" +
                                   std::to_string(endpoints[current].port));
        }
        return TERN_ERROR(kUnavailable, "etcd ", where, ": ", httplib::to_string(err));
      }
    }
    if (!reply.is_object()) {
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
      return Status(CodeFromGrpc(code), internal::Where(__FILE__, __LINE__) + "etcd " + where +
                                            ": " + Printable(message.substr(0, 200)));
    }
    if (res.status != 200) {
      return TERN_ERROR(kProtocol, "etcd ", where, ": HTTP ", res.status);
    }
    return reply;
  }

  // Call with a last line of defence: a library exception becomes a Status.
  Result<json> SafeCall(const std::string& path, const json& request) {
    try {
      return Call(path, request);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
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
  auto impl = std::make_unique<Impl>();
  for (const std::string& text : options.endpoints) {
    auto ep = ParseEndpoint(text);
    if (!ep.ok()) return std::move(ep).take_status();
    impl->endpoints.push_back(std::move(*ep));
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
