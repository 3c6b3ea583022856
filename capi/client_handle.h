// The tern_client handle (include/tern/tern.h), shared by client_api.cc
// and rank_api.cc: an admin address and the options to reach it, checked
// once at tern_client_open and read-only after, so every call may run from
// any thread at once.
#pragma once

#include <string>

#include "capi/capi_internal.h"
#include "tern/agent.h"

struct tern_client {
  static constexpr uint32_t kTag = 0x74436c69;  // "tCli"
  uint32_t tag = kTag;
  std::string address;
  tern::AgentClientOptions options;
};

namespace tern::capi {

inline Status CheckHandle(const tern_client* c) {
  TERN_REQUIRE(c != nullptr, kInvalidArgument, "client is NULL");
  TERN_REQUIRE(c->tag == tern_client::kTag, kInvalidArgument,
               "client is not a tern_client (another handle, or one already freed)");
  return Status::Ok();
}

}  // namespace tern::capi
