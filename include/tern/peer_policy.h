// Which backend carries traffic to a peer: RDMA (verbs, then UCX) inside a
// cluster when this machine has it, TCP across clusters and regions, with TLS
// on for every link that leaves the cluster. Config can pin a backend per
// peer or turn TLS off (e.g. a trusted private interconnect).
//
// Pure function of its inputs; thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tern/export.h"
#include "tern/status.h"

namespace tern {

struct PeerLocation {
  std::string id;  // stable peer name, the key of overrides
  std::string region;
  std::string cluster;
};

struct PeerPolicyConfig {
  // Preference inside one cluster, first available wins.
  std::vector<std::string> same_cluster = {"verbs", "ucx", "tcp"};
  std::string cross_cluster = "tcp";
  bool tls_leaving_cluster = true;
  bool tls_inside_cluster = false;
  std::map<std::string, std::string> overrides;  // peer id -> backend name
};

struct BackendChoice {
  std::string backend;  // "verbs", "ucx", "tcp", "loopback", ...
  bool tls = false;
};

// `available`: backend names usable on this machine (run-time probe).
// kUnavailable when nothing fits, kInvalidArgument for an override naming a
// backend that is not available.
TERN_EXPORT Result<BackendChoice> ChoosePeerBackend(const PeerPolicyConfig& config,
                                                    const PeerLocation& self,
                                                    const PeerLocation& peer,
                                                    const std::vector<std::string>& available);

}  // namespace tern
