// What the engine adapters share: the engine's URL, one HTTP request with
// a deadline and a bounded reply, and the bits of an engine's error text
// that go into our messages. Each adapter speaks its engine's routes on
// top (vllm_adapter.cc, sglang_adapter.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "tern/clock.h"
#include "tern/status.h"

namespace tern::agent {

struct EngineEndpoint {
  std::string host;  // without brackets for IPv6
  int port = 0;
};

// http://HOST:PORT (a trailing '/' allowed), kInvalidArgument otherwise.
Result<EngineEndpoint> ParseEngineUrl(const std::string& url);

struct EngineReply {
  int status = 0;
  std::string body;
};

// Replies of the control routes are a few hundred bytes; an error with a
// stack trace a few KiB.
constexpr size_t kEngineReplyBytesMax = 64 << 10;

// One request on a fresh connection (an engine that restarted between two
// calls is reached again; a call abandoned at its deadline never leaves a
// half-read reply on a kept connection). `timeout_ms` bounds the
// connection's reads and writes and the whole reply, timed by `clock`.
// kTimeout past the deadline, kUnavailable when the engine cannot be
// reached or drops the connection, kResourceExhausted for a reply over
// kEngineReplyBytesMax. Any HTTP status is a reply, not an error.
Result<EngineReply> EngineHttpCall(const EngineEndpoint& engine, uint32_t connect_timeout_ms,
                                   const char* method, const std::string& path,
                                   const std::string& body, uint32_t timeout_ms, Clock& clock);

// At most 600 bytes of an engine's text, for our messages.
std::string ClipEngineText(std::string_view s);

// The engine's error message from a JSON reply ({"error": {"message"}},
// {"error": "..."}, {"message": "..."}, {"detail": ...}), else the raw body;
// clipped.
std::string EngineErrorText(const std::string& body);

// The weight version an engine says it serves, from the JSON object its
// info route answered (vLLM's GET /weight_info, SGLang's /model_info):
// {"weight_version": "<n>"} is version n; null, or a name that is not a
// whole number ("default", SGLang's --weight-version), is none of ours
// (nullopt). kProtocol, naming `route`, for a reply without the field or
// with a field that is not a string.
Result<std::optional<uint64_t>> ServedWeightVersion(const std::string& body,
                                                    const std::string& route);

// JSON text; invalid UTF-8 is replaced, not thrown.
std::string DumpEngineJson(const nlohmann::json& j);

// Runs `attempt` (given its number, from 1) up to `attempts` times, sleeping
// backoff_ms x the number between tries, and stops early at an error a
// retry meets again (kInvalidArgument, kMismatch, kProtocol: malformed,
// inconsistent, not the API we speak). The last attempt's status.
Status RetryEngineAttempts(uint32_t attempts, uint32_t backoff_ms, Clock& clock,
                           const std::function<Status(uint32_t)>& attempt);

}  // namespace tern::agent
