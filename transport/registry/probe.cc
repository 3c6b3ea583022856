// ProbeTransports: every backend's run-time probe, in the registry's
// preference order.
#include <fstream>
#include <string>

#include "tern/transport_probe.h"
#include "tern/transport_registry.h"

namespace tern {

std::vector<BackendProbe> ProbeTransports() {
  std::vector<BackendProbe> out;
  out.push_back(ProbeVerbs());
  out.push_back(ProbeUcx());
  std::string cc;
  std::ifstream in("/proc/sys/net/ipv4/tcp_available_congestion_control");
  std::getline(in, cc);
  out.push_back({"tcp", true,
                 cc.empty() ? "congestion control unknown"
                            : "congestion control available: " + cc +
                                  (cc.find("bbr") == std::string::npos ? " (no bbr)" : "")});
  out.push_back({"loopback", true, "in-process"});
  return out;
}

}  // namespace tern
