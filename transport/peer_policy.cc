#include "tern/peer_policy.h"

#include <algorithm>

namespace tern {

Result<BackendChoice> ChoosePeerBackend(const PeerPolicyConfig& config, const PeerLocation& self,
                                        const PeerLocation& peer,
                                        const std::vector<std::string>& available) {
  auto has = [&](const std::string& name) {
    return std::find(available.begin(), available.end(), name) != available.end();
  };
  const bool same_cluster = !self.cluster.empty() && self.region == peer.region &&
                            self.cluster == peer.cluster;
  BackendChoice choice;
  choice.tls = same_cluster ? config.tls_inside_cluster : config.tls_leaving_cluster;
  if (auto it = config.overrides.find(peer.id); it != config.overrides.end()) {
    TERN_REQUIRE(has(it->second), kInvalidArgument, "peer ", peer.id, " is pinned to backend '",
                 it->second, "', which is not available here");
    choice.backend = it->second;
    return choice;
  }
  if (same_cluster) {
    for (const auto& name : config.same_cluster) {
      if (has(name)) {
        choice.backend = name;
        return choice;
      }
    }
  } else if (has(config.cross_cluster)) {
    choice.backend = config.cross_cluster;
    return choice;
  }
  return TERN_ERROR(kUnavailable, "no available backend reaches peer ", peer.id);
}

}  // namespace tern
