// Built when libibverbs-dev's headers were absent at configure time.
#include "tern/transport_probe.h"

namespace tern {

BackendProbe ProbeVerbs() {
  return {"verbs", false, "built without <infiniband/verbs.h> (libibverbs-dev absent at build time)"};
}

std::vector<BackendProbe> ProbeTransports() {
  return {ProbeVerbs(), ProbeUcx(), {"tcp", true, ""}, {"loopback", true, "in-process"}};
}

}  // namespace tern
