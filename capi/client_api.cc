// tern_client_*: a client of a running agent's admin port
// (include/tern/tern.h; the routes: docs/agent/operations.md). The handle
// holds only the address and options, so every call may run from any
// thread at once.
#include <cctype>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "capi/client_handle.h"
#include "tern/agent.h"

namespace tern::capi {
namespace {

constexpr size_t kClientOptionsBytesV1 = offsetof(tern_client_options, force) + sizeof(int);
constexpr size_t kAddressBytesMax = 1024;

// "HOST:PORT", "http://HOST:PORT" or "https://HOST:PORT" (an IPv6 host in
// brackets): the form only; the call says whether anyone listens.
Status CheckAddress(std::string address) {
  for (const char* scheme : {"https://", "http://"}) {
    if (address.rfind(scheme, 0) == 0) address.erase(0, std::string(scheme).size());
  }
  TERN_REQUIRE(address.find('/') == std::string::npos, kInvalidArgument, "admin address '",
               address.substr(0, 80), "': want [http:// or https://]HOST:PORT, no path");
  const size_t colon = address.rfind(':');
  TERN_REQUIRE(colon != std::string::npos && colon > 0 && colon + 1 < address.size(),
               kInvalidArgument, "admin address '", address.substr(0, 80), "': want HOST:PORT");
  const std::string port = address.substr(colon + 1);
  bool digits = port.size() <= 5;
  for (char ch : port) digits = digits && std::isdigit(static_cast<unsigned char>(ch)) != 0;
  TERN_REQUIRE(digits && std::stoul(port) >= 1 && std::stoul(port) <= 65535, kInvalidArgument,
               "admin address '", address.substr(0, 80), "': the port must be 1..65535");
  return Status::Ok();
}

Status Open(const char* admin_address, const tern_client_options* options, tern_client** out) {
  TERN_REQUIRE(out != nullptr, kInvalidArgument, "out is NULL");
  *out = nullptr;
  TERN_REQUIRE(admin_address != nullptr, kInvalidArgument, "admin_address is NULL");
  tern_client_options c;
  tern_client_options_init(&c);
  if (options != nullptr) {
    TERN_RETURN_IF_ERROR(
        ReadVersionedStruct(options, &c, sizeof c, kClientOptionsBytesV1, "tern_client_options"));
  }
  TERN_REQUIRE(c.force == 0 || c.force == 1, kInvalidArgument, "force is ", c.force,
               ": want 0 or 1");
  TERN_REQUIRE(c.supersede == 0 || c.supersede == 1, kInvalidArgument, "supersede is ",
               c.supersede, ": want 0 or 1");
  TERN_REQUIRE(c.timeout_ms > 0, kInvalidArgument, "timeout_ms is 0");
  auto handle = std::make_unique<tern_client>();
  TERN_ASSIGN_OR_RETURN(handle->address,
                        ReadString(admin_address, "admin_address", kAddressBytesMax));
  TERN_RETURN_IF_ERROR(CheckAddress(handle->address));
  TERN_ASSIGN_OR_RETURN(handle->options.token, ReadString(c.token, "token"));
  TERN_ASSIGN_OR_RETURN(handle->options.ca_pem, ReadString(c.ca_pem, "ca_pem", kPemBytesMax));
  TERN_ASSIGN_OR_RETURN(handle->options.cert_pem, ReadString(c.cert_pem, "cert_pem", kPemBytesMax));
  TERN_ASSIGN_OR_RETURN(handle->options.key_pem, ReadString(c.key_pem, "key_pem", kPemBytesMax));
  TERN_REQUIRE(handle->options.cert_pem.empty() == handle->options.key_pem.empty(),
               kInvalidArgument, "give both cert_pem and key_pem, or neither");
  handle->options.timeout_ms = c.timeout_ms;
  handle->options.force = c.force == 1;
  handle->options.supersede = c.supersede == 1;
  *out = handle.release();
  return Status::Ok();
}

// GET /status's JSON as the small struct; the agent's answer is not
// trusted to be well formed.
Status ParseStatus(const std::string& text, tern_status* st) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  TERN_REQUIRE(j.is_object(), kCorrupt, "GET /status: the answer is not a JSON object");
  auto u64 = [&](const char* key, uint64_t* v) -> Status {
    auto it = j.find(key);
    TERN_REQUIRE(it != j.end() && it->is_number_unsigned(), kCorrupt, "GET /status: no unsigned \"",
                 key, "\"");
    *v = it->get<uint64_t>();
    return Status::Ok();
  };
  auto role = j.find("role");
  TERN_REQUIRE(role != j.end() && role->is_string(), kCorrupt, "GET /status: no \"role\"");
  const std::string r = role->get<std::string>();
  st->root = r == "root" ? 1 : 0;
  st->relay_only = r == "relay-only" ? 1 : 0;
  auto joined = j.find("joined");
  TERN_REQUIRE(joined != j.end() && joined->is_boolean(), kCorrupt, "GET /status: no \"joined\"");
  st->joined = joined->get<bool>() ? 1 : 0;
  TERN_RETURN_IF_ERROR(u64("head", &st->head));
  TERN_RETURN_IF_ERROR(u64("served_version", &st->served_version));
  st->held_version = st->served_version;
  if (st->relay_only) TERN_RETURN_IF_ERROR(u64("held_version", &st->held_version));
  // An agent from before epochs sends neither: it has only epoch 0.
  auto epoch = [&](const char* key, uint32_t* v) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Status::Ok();
    TERN_REQUIRE(it->is_number_unsigned() && it->get<uint64_t>() <= UINT32_MAX, kCorrupt,
                 "GET /status: \"", key, "\" is not a 32-bit unsigned number");
    *v = it->get<uint32_t>();
    return Status::Ok();
  };
  TERN_RETURN_IF_ERROR(epoch("head_epoch", &st->head_epoch));
  TERN_RETURN_IF_ERROR(epoch("served_epoch", &st->served_epoch));
  auto count = [&](const char* key) -> uint32_t {
    auto it = j.find(key);
    if (it == j.end() || !it->is_array()) return 0;
    return static_cast<uint32_t>(std::min<size_t>(it->size(), UINT32_MAX));
  };
  st->member_count = count("members");
  st->version_count = count("versions");
  auto members = j.find("members");
  if (members != j.end() && members->is_array()) {
    for (const nlohmann::json& m : *members) {
      if (!m.is_object()) continue;
      auto role = m.find("role");
      auto version = m.find("version");
      if (role != m.end() && *role == "serving" && version != m.end() &&
          version->is_number_unsigned() && version->get<uint64_t>() == st->head)
        ++st->members_at_head;
    }
  }
  return Status::Ok();
}

}  // namespace
}  // namespace tern::capi

using tern::Result;
using tern::Status;
using tern::capi::CheckHandle;
using tern::capi::Guard;
using tern::capi::WriteText;

extern "C" {

void tern_client_options_init(tern_client_options* c) {
  if (c == nullptr) return;
  const tern::AgentClientOptions d;
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->timeout_ms = d.timeout_ms;
  c->force = d.force ? 1 : 0;
  c->supersede = d.supersede ? 1 : 0;
}

tern_code tern_client_open(const char* admin_address, const tern_client_options* options,
                           tern_client** out) {
  return Guard([&] { return tern::capi::Open(admin_address, options, out); });
}

tern_code tern_client_publish(tern_client* c, const char* checkpoint_path, uint64_t version) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(CheckHandle(c));
    TERN_REQUIRE(checkpoint_path != nullptr, kInvalidArgument, "checkpoint_path is NULL");
    TERN_ASSIGN_OR_RETURN(std::string path,
                          tern::capi::ReadString(checkpoint_path, "checkpoint_path"));
    TERN_REQUIRE(!path.empty(), kInvalidArgument, "checkpoint_path is empty");
    return tern::PublishToRoot(c->address, path, version, c->options);
  });
}

tern_code tern_client_drain_member(tern_client* c, const char* member_id) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(CheckHandle(c));
    TERN_ASSIGN_OR_RETURN(std::string id, tern::capi::ReadString(member_id, "member_id"));
    return tern::DrainMemberAt(c->address, id, c->options);
  });
}

tern_code tern_client_remove_member(tern_client* c, const char* member_id, uint32_t rejoin_after_ms) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(CheckHandle(c));
    TERN_ASSIGN_OR_RETURN(std::string id, tern::capi::ReadString(member_id, "member_id"));
    return tern::RemoveMemberAt(c->address, id, rejoin_after_ms, c->options);
  });
}

tern_code tern_client_set_retention(tern_client* c, uint32_t keep_patches, uint32_t keyframe_every) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(CheckHandle(c));
    return tern::SetRetentionAt(c->address, keep_patches, keyframe_every, c->options);
  });
}

tern_code tern_client_status(tern_client* c, tern_status* out) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(CheckHandle(c));
    TERN_REQUIRE(out != nullptr, kInvalidArgument, "out is NULL");
    TERN_ASSIGN_OR_RETURN(std::string text, tern::AgentStatusJson(c->address, c->options));
    tern_status st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    TERN_RETURN_IF_ERROR(tern::capi::ParseStatus(text, &st));
    return tern::capi::WriteVersionedStruct(&st, sizeof st, out, tern::capi::kStatusBytesV1,
                                            "tern_status");
  });
}

tern_code tern_client_status_json(tern_client* c, char* buf, size_t cap, size_t* len) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(CheckHandle(c));
    TERN_ASSIGN_OR_RETURN(std::string text, tern::AgentStatusJson(c->address, c->options));
    return WriteText(text, buf, cap, len);
  });
}

tern_code tern_client_metrics(tern_client* c, char* buf, size_t cap, size_t* len) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(CheckHandle(c));
    TERN_ASSIGN_OR_RETURN(std::string text, tern::AgentMetricsText(c->address, c->options));
    return WriteText(text, buf, cap, len);
  });
}

tern_code tern_client_publish_jobs_json(tern_client* c, char* buf, size_t cap, size_t* len) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(CheckHandle(c));
    TERN_ASSIGN_OR_RETURN(std::string text, tern::AgentPublishJobsJson(c->address, c->options));
    return WriteText(text, buf, cap, len);
  });
}

tern_code tern_client_events_json(tern_client* c, uint64_t after_seq, uint32_t max_events,
                                  uint32_t timeout_ms, char* buf, size_t cap, size_t* len) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(CheckHandle(c));
    TERN_REQUIRE(max_events >= 1 && max_events <= 1024, kOutOfRange, "max_events is ", max_events,
                 ": want 1..1024");
    TERN_REQUIRE(
        timeout_ms <= 5000, kOutOfRange, "timeout_ms is ", timeout_ms,
        ": at most 5000 (the admin port's long-poll bound; poll again with after_seq = next)");
    TERN_ASSIGN_OR_RETURN(std::string text, tern::AgentEventsJson(c->address, after_seq, max_events,
                                                                  timeout_ms, c->options));
    return WriteText(text, buf, cap, len);
  });
}

void tern_client_free(tern_client* c) {
  if (c == nullptr || c->tag != tern_client::kTag) return;
  c->tag = 0;
  delete c;
}

}  // extern "C"
