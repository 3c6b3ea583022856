// Run-time probes: verbs (dlopen + device/port listing) and the summary of
// every backend. No #ifdef decides what exists; the probes ask the machine.
#include "transport/verbs/probe.h"

#include <sstream>

#include "transport/verbs/ibv_api.h"

namespace tern {

namespace verbs {

BackendProbe ProbeVerbsLibrary(const std::string& soname) {
  BackendProbe probe{"verbs", false, ""};
  auto api = IbvApi::Load(soname);
  if (!api.ok()) {
    probe.detail = api.status().message();
    return probe;
  }
  auto ports = ListPorts(**api);
  if (!ports.ok()) {
    probe.detail = soname + " loaded; " + ports.status().message();
    return probe;
  }
  int active = 0;
  std::ostringstream out;
  out << soname << " loaded, ";
  std::string last_device;
  int devices = 0;
  for (const PortInfo& p : *ports) devices += p.device != last_device, last_device = p.device;
  out << devices << (devices == 1 ? " device" : " devices");
  for (const PortInfo& p : *ports) {
    active += p.active;
    out << (&p == &ports->front() ? ": " : ", ") << p.device << ":" << int{p.port} << " "
        << (p.active ? "active" : "down") << " " << (p.ethernet ? "RoCE" : "IB") << " mtu "
        << p.active_mtu_bytes;
  }
  if (active == 0 && !ports->empty()) out << "; no active port";
  probe.available = active > 0;
  probe.detail = out.str();
  return probe;
}

}  // namespace verbs

BackendProbe ProbeVerbs() { return verbs::ProbeVerbsLibrary("libibverbs.so.1"); }

}  // namespace tern
