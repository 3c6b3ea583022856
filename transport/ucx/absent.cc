// Built when UCX's development files were absent at configure time.
#include "tern/transport_probe.h"
#include "tern/ucx_transport.h"

namespace tern {

Result<std::unique_ptr<Transport>> NewUcxTransport(UcxOptions, Clock&) {
  return TERN_ERROR(kUnavailable, "ucx: tern was built without UCX (install libucx-dev and rebuild)");
}

BackendProbe ProbeUcx() {
  return {"ucx", false, "built without UCX (libucx-dev absent at build time)"};
}

}  // namespace tern
