// The in-process loopback backend: real shipped code, not a test mock. Every
// layer above the transport runs its tests over it end to end.
//
// A LoopbackNetwork is the "wire": transports made from the same network can
// reach each other's listeners by name. There is no global network; the
// caller creates one and passes it in. Chunks are copied with memcpy straight
// from the sender's registered memory into the receiver's window and still
// checksummed (so corruption injected above is detected like on a real wire).
//
// Thread safety: as transport.h. The network must outlive its transports.
#pragma once

#include <memory>

#include "tern/export.h"
#include "tern/transport.h"

namespace tern {

class LoopbackNetwork {
 public:
  LoopbackNetwork();
  ~LoopbackNetwork();
  LoopbackNetwork(const LoopbackNetwork&) = delete;
  LoopbackNetwork& operator=(const LoopbackNetwork&) = delete;

  struct Impl;
  Impl* impl() { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

TERN_EXPORT std::unique_ptr<Transport> NewLoopbackTransport(LoopbackNetwork& network);

}  // namespace tern
