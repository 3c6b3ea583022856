// Head-window sends (head_send.h).
#include "xfer/server/head_send.h"

namespace tern::xfer {

std::string BitmapFrom(uint64_t chunks, uint64_t first) {
  std::string bits((chunks + 7) / 8, '\0');
  for (uint64_t i = first; i < chunks; ++i) bits[i >> 3] |= static_cast<char>(1u << (i & 7));
  return bits;
}

std::shared_ptr<HeadSend> HeadSend::Start(ThreadTracker& threads,
                                          std::shared_ptr<Connection> conn, MemoryRegion region,
                                          uint64_t window, uint64_t size_bytes, uint64_t chunk_bytes,
                                          uint64_t head_chunks, SendOptions options, Clock& clock) {
  auto head = std::make_shared<HeadSend>();
  auto map = ChunkMap::Make(size_bytes, chunk_bytes);
  if (map.ok()) map->SetBits(BitmapFrom(map->chunks(), head_chunks)).IgnoreError();  // sized from the same map
  options.on_progress = nullptr;  // the caller's hook runs on session threads only
  threads.Spawn([head, conn = std::move(conn), region, window, map = std::move(map), options, &clock]() mutable {
    Status st = map.ok() ? SendChunks(*conn, region, 0, window, *map, options, clock) : map.status();
    std::lock_guard<std::mutex> lock(head->mu_);
    head->status_ = std::move(st);
    head->done_ = true;
    head->cv_.notify_all();
  });
  return head;
}

Status HeadSend::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });  // bounded by SendChunks' stall timeout
  return status_;
}

}  // namespace tern::xfer
