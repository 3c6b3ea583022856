// Built when libibverbs-dev's headers were absent at configure time.
#include "tern/transport_probe.h"
#include "tern/verbs_transport.h"

namespace tern {

Result<std::unique_ptr<Transport>> NewVerbsTransport(VerbsOptions, Clock&) {
  return TERN_ERROR(kUnavailable, "verbs: built without <infiniband/verbs.h> (libibverbs-dev absent at build time)");
}

BackendProbe ProbeVerbs() {
  return {"verbs", false, "built without <infiniband/verbs.h> (libibverbs-dev absent at build time)"};
}

}  // namespace tern
