// tern_agent_*: an agent in the caller's process (include/tern/tern.h;
// the handle: agent_handle.h).
#include <cstring>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "capi/agent_handle.h"
#include "tern/agent.h"
#include "tern/transport_registry.h"

namespace tern::capi {
namespace {

// The size of tern_agent_options in ABI 1.0: a caller compiled against it
// passes at least this.
constexpr size_t kAgentOptionsBytesV1 = offsetof(tern_agent_options, log_user) + sizeof(void*);
// tern_tensor in ABI 1.1, where it appeared.
constexpr size_t kTensorBytesV1 = offsetof(tern_tensor, bytes) + sizeof(uint64_t);

Status CheckFlag(int value, const char* field) {
  TERN_REQUIRE(value == 0 || value == 1, kInvalidArgument, field, " is ", value, ": want 0 or 1");
  return Status::Ok();
}

// The transport the options name, TLS files checked for the name.
Result<std::unique_ptr<Transport>> MakeTransport(const tern_agent_options& c, const LogFn& log) {
  TERN_ASSIGN_OR_RETURN(std::string name, ReadString(c.transport, "transport"));
  if (name.empty()) name = "tcp+tls";
  TERN_REQUIRE(name == "tcp+tls" || name == "tcp" || name == "ucx" || name == "verbs",
               kInvalidArgument, "transport '", name.substr(0, 40),
               "': want tcp+tls, tcp, ucx or verbs");
  TransportOptions o;
  TERN_ASSIGN_OR_RETURN(o.tcp.tls.cert_file, ReadString(c.tls_cert_file, "tls_cert_file"));
  TERN_ASSIGN_OR_RETURN(o.tcp.tls.key_file, ReadString(c.tls_key_file, "tls_key_file"));
  TERN_ASSIGN_OR_RETURN(o.tcp.tls.ca_file, ReadString(c.tls_ca_file, "tls_ca_file"));
  TERN_ASSIGN_OR_RETURN(o.tcp.tls.server_name, ReadString(c.tls_server_name, "tls_server_name"));
  const bool any_tls = !o.tcp.tls.cert_file.empty() || !o.tcp.tls.key_file.empty() ||
                       !o.tcp.tls.ca_file.empty() || !o.tcp.tls.server_name.empty();
  if (name == "tcp+tls") {
    TERN_REQUIRE(
        !o.tcp.tls.cert_file.empty() && !o.tcp.tls.key_file.empty() && !o.tcp.tls.ca_file.empty(),
        kInvalidArgument,
        "transport tcp+tls (the default) needs tls_cert_file, tls_key_file and "
        "tls_ca_file; say transport \"tcp\" for plain TCP on a trusted network");
    o.tcp.tls.enabled = true;
  } else {
    TERN_REQUIRE(!any_tls, kInvalidArgument, "transport ", name,
                 " carries no TLS: the tls_* fields need transport tcp+tls");
  }
  o.tcp.log = log;
  o.ucx.log = log;
  o.verbs.log = log;
  return NewTransport(name, o);
}

// The C options as AgentOptions (transport and log filled by the caller).
Status ToAgentOptions(const tern_agent_options& c, AgentOptions* o) {
  TERN_RETURN_IF_ERROR(CheckFlag(c.root, "root"));
  TERN_RETURN_IF_ERROR(CheckFlag(c.may_relay, "may_relay"));
  TERN_RETURN_IF_ERROR(CheckFlag(c.relay_only, "relay_only"));
  TERN_RETURN_IF_ERROR(CheckFlag(c.admin_insecure, "admin_insecure"));
  TERN_RETURN_IF_ERROR(CheckFlag(c.stream_apply, "stream_apply"));
  o->root = c.root == 1;
  TERN_ASSIGN_OR_RETURN(o->join, ReadString(c.join, "join"));
  TERN_REQUIRE(o->root == o->join.empty(), kInvalidArgument,
               o->root ? "a root joins nothing: join must be NULL"
                       : "a member needs join (the root's \"HOST:PORT\")");
  TERN_ASSIGN_OR_RETURN(o->listen, ReadString(c.listen, "listen"));
  TERN_REQUIRE(!o->listen.empty(), kInvalidArgument,
               "listen is required (\"HOST:PORT\"; port 0 picks one)");
  TERN_ASSIGN_OR_RETURN(o->admin_listen, ReadString(c.admin_listen, "admin_listen"));
  TERN_ASSIGN_OR_RETURN(o->id, ReadString(c.id, "id"));
  if (c.region != nullptr) {
    TERN_ASSIGN_OR_RETURN(o->region, ReadString(c.region, "region"));
  }
  TERN_ASSIGN_OR_RETURN(o->cluster, ReadString(c.cluster, "cluster"));
  TERN_ASSIGN_OR_RETURN(o->island, ReadString(c.island, "island"));
  o->may_relay = c.may_relay == 1;
  o->relay_only = c.relay_only == 1;
  TERN_REQUIRE(c.uplink_bytes_per_s > 0 && c.downlink_bytes_per_s > 0 &&
                   c.uplink_bytes_per_s < 1e15 && c.downlink_bytes_per_s < 1e15,
               kInvalidArgument,
               "uplink_bytes_per_s and downlink_bytes_per_s must be in (0, 1e15)");
  o->uplink_bytes_per_s = c.uplink_bytes_per_s;
  o->downlink_bytes_per_s = c.downlink_bytes_per_s;

  TERN_ASSIGN_OR_RETURN(o->data_dir, ReadString(c.data_dir, "data_dir"));
  TERN_REQUIRE(!o->data_dir.empty(), kInvalidArgument, "data_dir is required");
  TERN_ASSIGN_OR_RETURN(o->signing_key_pem,
                        ReadString(c.signing_key_pem, "signing_key_pem", kPemBytesMax));
  TERN_REQUIRE(c.trusted_keys_count <= kTrustedKeysMax, kOutOfRange, "trusted_keys_count is ",
               c.trusted_keys_count, ": at most ", kTrustedKeysMax);
  TERN_REQUIRE(c.trusted_keys_count == 0 || c.trusted_keys_pem != nullptr, kInvalidArgument,
               "trusted_keys_pem is NULL but trusted_keys_count is ", c.trusted_keys_count);
  for (size_t i = 0; i < c.trusted_keys_count; ++i) {
    TERN_REQUIRE(c.trusted_keys_pem[i] != nullptr, kInvalidArgument, "trusted_keys_pem[", i,
                 "] is NULL");
    TERN_ASSIGN_OR_RETURN(std::string pem,
                          ReadString(c.trusted_keys_pem[i], "trusted_keys_pem[]", kPemBytesMax));
    o->trusted_keys_pem.push_back(std::move(pem));
  }
  TERN_REQUIRE(o->root || !o->trusted_keys_pem.empty(), kInvalidArgument,
               "a member needs trusted_keys_pem (the root's public key: tern_agent_public_key_pem, "
               "or DIR/public-key.pem of a tern-agent root)");
  TERN_ASSIGN_OR_RETURN(o->join_token, ReadString(c.join_token, "join_token"));
  TERN_ASSIGN_OR_RETURN(o->admin_token, ReadString(c.admin_token, "admin_token"));
  o->admin_insecure = c.admin_insecure == 1;
  TERN_ASSIGN_OR_RETURN(o->admin_tls_cert_pem,
                        ReadString(c.admin_tls_cert_pem, "admin_tls_cert_pem", kPemBytesMax));
  TERN_ASSIGN_OR_RETURN(o->admin_tls_key_pem,
                        ReadString(c.admin_tls_key_pem, "admin_tls_key_pem", kPemBytesMax));
  TERN_REQUIRE(o->admin_tls_cert_pem.empty() == o->admin_tls_key_pem.empty(), kInvalidArgument,
               "give both admin_tls_cert_pem and admin_tls_key_pem, or neither");
  TERN_ASSIGN_OR_RETURN(
      o->admin_tls_client_ca_pem,
      ReadString(c.admin_tls_client_ca_pem, "admin_tls_client_ca_pem", kPemBytesMax));
  TERN_REQUIRE(o->admin_tls_client_ca_pem.empty() || !o->admin_tls_cert_pem.empty(),
               kInvalidArgument,
               "admin_tls_client_ca_pem needs admin_tls_cert_pem and admin_tls_key_pem");
  TERN_ASSIGN_OR_RETURN(o->publish_dir, ReadString(c.publish_dir, "publish_dir"));
  o->max_version_jump = c.max_version_jump;
  TERN_ASSIGN_OR_RETURN(o->seed_checkpoint, ReadString(c.seed_checkpoint, "seed_checkpoint"));
  o->seed_version = c.seed_version;

  TERN_ASSIGN_OR_RETURN(o->board_etcd, ReadString(c.board_etcd, "board_etcd"));
  TERN_REQUIRE(o->board_etcd.empty() || o->root, kInvalidArgument, "board_etcd is a root's option");
  o->etcd_lease_s = c.etcd_lease_s;

  o->stripes = c.stripes;
  o->fanout_max = c.fanout_max;
  o->root_fanout_max = c.root_fanout_max;
  o->keep_patches = c.keep_patches;
  o->keyframe_every = c.keyframe_every;
  o->segment_elements = c.segment_elements;
  TERN_REQUIRE(c.patch_format <= 2, kInvalidArgument, "patch_format is ", c.patch_format,
               ": want 0 (the default), 1 or 2");
  o->patch_format = static_cast<uint16_t>(c.patch_format);
  TERN_RETURN_IF_ERROR(CheckFlag(c.patch_nibbles, "patch_nibbles"));
  o->patch_nibbles = c.patch_nibbles == 1;

  o->heartbeat_ms = c.heartbeat_ms;
  o->dead_after_ms = c.dead_after_ms;
  o->spare_grace_ms = c.spare_grace_ms;
  o->stream_apply = c.stream_apply == 1;
  o->parent_stall_ms = c.parent_stall_ms;
  o->relay_probation_ms = c.relay_probation_ms;
  o->push_window_bytes = c.push_window_bytes;
  o->threads = c.threads;
  return Status::Ok();
}

Status Start(const tern_agent_options* options, tern_agent** out) {
  TERN_REQUIRE(out != nullptr, kInvalidArgument, "out is NULL");
  *out = nullptr;
  tern_agent_options c;
  tern_agent_options_init(&c);
  TERN_RETURN_IF_ERROR(
      ReadVersionedStruct(options, &c, sizeof c, kAgentOptionsBytesV1, "tern_agent_options"));
  AgentOptions o;
  TERN_RETURN_IF_ERROR(ToAgentOptions(c, &o));
  if (c.log != nullptr) {
    const tern_log_fn fn = c.log;
    void* const user = c.log_user;
    o.log = [fn, user](std::string_view line) {
      const std::string text(line);
      fn(user, text.c_str());
    };
  }
  auto handle = std::make_unique<tern_agent>();
  TERN_ASSIGN_OR_RETURN(handle->transport, MakeTransport(c, o.log));
  o.transport = handle->transport.get();
  TERN_ASSIGN_OR_RETURN(handle->agent, Agent::Start(o));
  *out = handle.release();
  return Status::Ok();
}

void Stop(tern_agent* a) {
  a->stopping.store(true);
  std::unique_lock lock(a->mu);
  if (a->agent) a->agent->Stop();
  a->agent.reset();
  a->transport.reset();
}

}  // namespace

Result<std::vector<PublishTensor>> ReadTensors(const tern_tensor* tensors, size_t count) {
  size_t stride = 0;
  std::memcpy(&stride, tensors, sizeof stride);
  std::vector<PublishTensor> list;
  list.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const auto* at = reinterpret_cast<const unsigned char*>(tensors) + i * stride;
    size_t size = 0;
    std::memcpy(&size, at, sizeof size);
    TERN_REQUIRE(size == stride, kInvalidArgument, "tensors[", i, "].struct_size is ", size,
                 ", tensors[0]'s is ", stride, ": one array has one element size");
    tern_tensor c;
    tern_tensor_init(&c);
    const std::string what = "tensors[" + std::to_string(i) + "]";
    TERN_RETURN_IF_ERROR(ReadVersionedStruct(at, &c, sizeof c, kTensorBytesV1, what.c_str()));
    PublishTensor t;
    TERN_REQUIRE(c.name != nullptr, kInvalidArgument, what, ".name is NULL");
    TERN_ASSIGN_OR_RETURN(t.name, ReadString(c.name, (what + ".name").c_str()));
    TERN_REQUIRE(c.dtype != nullptr, kInvalidArgument, "tensor ", t.name, ": dtype is NULL");
    TERN_ASSIGN_OR_RETURN(std::string dtype, ReadString(c.dtype, (what + ".dtype").c_str()));
    const std::optional<DType> parsed = DTypeFromName(dtype);
    TERN_REQUIRE(parsed.has_value(), kInvalidArgument, "tensor ", t.name, ": unknown dtype '",
                 dtype.substr(0, 40), "' (want a safetensors name: BF16, F32, F8_E4M3, ...)");
    t.dtype = *parsed;
    TERN_REQUIRE(c.ndim <= tern::kMaxPublishTensorRank, kInvalidArgument, "tensor ", t.name,
                 ": ndim ", c.ndim, " (at most ", tern::kMaxPublishTensorRank, ")");
    TERN_REQUIRE(c.shape != nullptr || c.ndim == 0, kInvalidArgument, "tensor ", t.name,
                 ": shape is NULL with ndim ", c.ndim);
    t.shape.assign(c.shape, c.shape + c.ndim);
    t.data = c.data;
    t.bytes = c.bytes;
    list.push_back(std::move(t));
  }
  return list;
}

}  // namespace tern::capi

using tern::Agent;
using tern::Status;
using tern::capi::Guard;
using tern::capi::ReadTensors;
using tern::capi::WithAgent;

extern "C" {

void tern_agent_options_init(tern_agent_options* c) {
  if (c == nullptr) return;
  const tern::AgentOptions d;
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->may_relay = d.may_relay ? 1 : 0;
  c->uplink_bytes_per_s = d.uplink_bytes_per_s;
  c->downlink_bytes_per_s = d.downlink_bytes_per_s;
  c->max_version_jump = d.max_version_jump;
  c->etcd_lease_s = d.etcd_lease_s;
  c->stripes = d.stripes;
  c->fanout_max = d.fanout_max;
  c->root_fanout_max = d.root_fanout_max;
  c->keep_patches = d.keep_patches;
  c->keyframe_every = d.keyframe_every;
  c->segment_elements = d.segment_elements;
  c->patch_format = d.patch_format;
  c->patch_nibbles = d.patch_nibbles ? 1 : 0;
  c->heartbeat_ms = d.heartbeat_ms;
  c->dead_after_ms = d.dead_after_ms;
  c->spare_grace_ms = d.spare_grace_ms;
  c->stream_apply = d.stream_apply ? 1 : 0;
  c->parent_stall_ms = d.parent_stall_ms;
  c->relay_probation_ms = d.relay_probation_ms;
  c->push_window_bytes = d.push_window_bytes;
  c->threads = d.threads;
}

tern_code tern_agent_start(const tern_agent_options* options, tern_agent** out) {
  return Guard([&] { return tern::capi::Start(options, out); });
}

tern_code tern_agent_publish(tern_agent* a, const char* checkpoint_path, uint64_t version) {
  return Guard([&] {
    TERN_REQUIRE(checkpoint_path != nullptr, kInvalidArgument, "checkpoint_path is NULL");
    TERN_ASSIGN_OR_RETURN(std::string path,
                          tern::capi::ReadString(checkpoint_path, "checkpoint_path"));
    return WithAgent(a, [&](Agent& agent) { return agent.Publish(path, version); });
  });
}

tern_code tern_agent_drain_member(tern_agent* a, const char* member_id) {
  return Guard([&] {
    TERN_ASSIGN_OR_RETURN(std::string id, tern::capi::ReadString(member_id, "member_id"));
    return WithAgent(a, [&](Agent& agent) { return agent.DrainMember(id); });
  });
}

tern_code tern_agent_remove_member(tern_agent* a, const char* member_id, uint32_t rejoin_after_ms) {
  return Guard([&] {
    TERN_ASSIGN_OR_RETURN(std::string id, tern::capi::ReadString(member_id, "member_id"));
    return WithAgent(a, [&](Agent& agent) { return agent.RemoveMember(id, rejoin_after_ms); });
  });
}

tern_code tern_agent_set_retention(tern_agent* a, uint32_t keep_patches, uint32_t keyframe_every) {
  return Guard([&] {
    return WithAgent(a, [&](Agent& agent) { return agent.SetRetention(keep_patches, keyframe_every); });
  });
}

void tern_tensor_init(tern_tensor* tensor) {
  if (tensor == nullptr) return;
  std::memset(tensor, 0, sizeof *tensor);
  tensor->struct_size = sizeof *tensor;
}

tern_code tern_view_digest(const tern_tensor* tensors, size_t count, uint64_t out[4]) {
  return Guard([&]() -> Status {
    TERN_REQUIRE(tensors != nullptr, kInvalidArgument, "view_digest: tensors is NULL");
    TERN_REQUIRE(out != nullptr, kInvalidArgument, "view_digest: out is NULL");
    TERN_REQUIRE(count >= 1 && count <= tern::kMaxPublishTensors, kInvalidArgument,
                 "view_digest: count ", count, ": want 1..", tern::kMaxPublishTensors);
    TERN_ASSIGN_OR_RETURN(std::vector<tern::PublishTensor> list, ReadTensors(tensors, count));
    TERN_ASSIGN_OR_RETURN(tern::ViewDigest d, tern::DigestOfTensors(list));
    for (int l = 0; l < 4; ++l) out[l] = d.lanes[l];
    return Status::Ok();
  });
}

tern_code tern_agent_publish_tensors(tern_agent* a, uint64_t version, const tern_tensor* tensors,
                                     size_t count) {
  return Guard([&] {
    TERN_REQUIRE(tensors != nullptr, kInvalidArgument, "tensors is NULL");
    TERN_REQUIRE(count >= 1 && count <= tern::kMaxPublishTensors, kInvalidArgument, "count ",
                 count, ": want 1..", tern::kMaxPublishTensors);
    TERN_ASSIGN_OR_RETURN(std::vector<tern::PublishTensor> list, ReadTensors(tensors, count));
    return WithAgent(a, [&](Agent& agent) { return agent.PublishTensors(version, list); });
  });
}

tern_code tern_agent_status(tern_agent* a, tern_status* out) {
  return Guard([&] {
    return WithAgent(a, [&](Agent& agent) {
      TERN_REQUIRE(out != nullptr, kInvalidArgument, "out is NULL");
      const tern::AgentSnapshot s = agent.Snapshot();
      tern_status st;
      std::memset(&st, 0, sizeof st);
      st.struct_size = sizeof st;
      st.root = s.root ? 1 : 0;
      st.relay_only = s.relay_only ? 1 : 0;
      st.joined = s.joined ? 1 : 0;
      st.head = s.head;
      st.served_version = s.served_version;
      st.held_version = s.held_version;
      st.head_epoch = s.head_epoch;
      st.served_epoch = s.served_epoch;
      st.member_count = static_cast<uint32_t>(s.members.size());
      st.version_count = static_cast<uint32_t>(s.versions.size());
      for (const tern::AgentMemberStatus& m : s.members)
        if (!m.relay_only && m.served_version == s.head) ++st.members_at_head;
      return tern::capi::WriteVersionedStruct(&st, sizeof st, out, tern::capi::kStatusBytesV1,
                                              "tern_status");
    });
  });
}

tern_code tern_agent_status_json(tern_agent* a, char* buf, size_t cap, size_t* len) {
  return Guard([&] {
    return WithAgent(a, [&](Agent& agent) {
      return tern::capi::WriteText(tern::AgentSnapshotJson(agent.Snapshot()), buf, cap, len);
    });
  });
}

tern_code tern_agent_public_key_pem(tern_agent* a, char* buf, size_t cap, size_t* len) {
  return Guard([&] {
    return WithAgent(a, [&](Agent& agent) {
      const std::string pem = agent.PublicKeyPem();
      TERN_REQUIRE(!pem.empty(), kNotFound,
                   "this agent signs nothing (only a root has a public key)");
      return tern::capi::WriteText(pem, buf, cap, len);
    });
  });
}

tern_code tern_agent_listen_address(tern_agent* a, char* buf, size_t cap, size_t* len) {
  return Guard([&] {
    return WithAgent(a, [&](Agent& agent) {
      return tern::capi::WriteText(agent.Snapshot().listen_address, buf, cap, len);
    });
  });
}

tern_code tern_agent_admin_address(tern_agent* a, char* buf, size_t cap, size_t* len) {
  return Guard([&] {
    return WithAgent(a, [&](Agent& agent) {
      return tern::capi::WriteText(agent.Snapshot().admin_address, buf, cap, len);
    });
  });
}

tern_code tern_agent_stop(tern_agent* a) {
  return Guard([&] {
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(a));
    tern::capi::Stop(a);
    return Status::Ok();
  });
}

void tern_agent_free(tern_agent* a) {
  if (a == nullptr) return;
  // Not a tern_agent: leave it alone rather than free what we did not make.
  if (a->tag != tern_agent::kTag) return;
  try {
    tern::capi::Stop(a);
  } catch (...) {
    // Stop reports nothing; the handle is freed regardless.
  }
  a->tag = 0;
  delete a;
}

}  // extern "C"
