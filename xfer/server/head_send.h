// The chunks of a client's head window (xfer protocol, INFO flag HEAD),
// sent on their own thread so the rest of the file can start as soon as
// WANT arrives: a send ends only once all its chunks are acknowledged, so
// one after the other the link would idle a round trip.
//
// Contract: Start sends chunks [0, head_chunks) of the file in `region`
// into `window` with SendChunks; Wait blocks until that send ended (bounded
// by SendChunks' stall timeout) and returns its status. The region, the
// connection and the clock must outlive the send: call Wait before
// deregistering the region.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "base/thread_tracker.h"
#include "tern/xfer_chunks.h"

namespace tern::xfer {

// The bitmap of `chunks` chunks with chunks [first, chunks) set: what a
// send of only the chunks before `first` treats as present.
std::string BitmapFrom(uint64_t chunks, uint64_t first);

class HeadSend {
 public:
  static std::shared_ptr<HeadSend> Start(ThreadTracker& threads,
                                         std::shared_ptr<Connection> conn, MemoryRegion region,
                                         uint64_t window, uint64_t size_bytes, uint64_t chunk_bytes,
                                         uint64_t head_chunks, SendOptions options, Clock& clock);
  Status Wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

}  // namespace tern::xfer
