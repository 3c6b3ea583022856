// The etcd gateway's JSON, decoded strictly (internal to the etcd client;
// exposed for its unit tests). Every function takes untrusted input and
// returns kProtocol for anything that is not what etcd 3.4 sends: a field of
// the wrong type, an int64 out of range, bad base64, too many entries.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "agent/etcd/etcd.h"
#include "tern/status.h"

namespace tern::agent {

// RFC 4648 base64 with padding (what protobuf's JSON mapping uses for bytes).
std::string Base64Encode(std::string_view bytes);
// Strict: the standard alphabet, length a multiple of 4, padding only at the
// end; also accepts the URL-safe alphabet, which the JSON mapping allows.
Result<std::string> Base64Decode(std::string_view text);

// An int64 field: the gateway writes them as decimal strings; numbers are
// accepted too. An absent field is 0 (proto3 omits defaults).
Result<int64_t> Int64Field(const nlohmann::json& object, const char* name);
// A bool field; absent is false.
Result<bool> BoolField(const nlohmann::json& object, const char* name);
// header.revision of a reply.
Result<int64_t> HeaderRevision(const nlohmann::json& reply);
// A RangeResponse object; more than max_kvs entries is kProtocol.
Result<EtcdRange> ParseRange(const nlohmann::json& reply, size_t max_kvs);

}  // namespace tern::agent
