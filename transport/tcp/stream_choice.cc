#include "transport/tcp/stream_choice.h"

namespace tern::tcp {

ChunkChoice ChooseChunkStream(std::span<const StreamView> streams, uint32_t self, uint64_t bytes) {
  auto open = [&](uint32_t i) { return i == self || streams[i].open; };
  const auto n = static_cast<uint32_t>(streams.size());
  if (self >= n) return {};
  int lowest_open = -1, lowest_warm = -1;
  bool rates_known = true;
  uint32_t warm_open = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (!open(i)) continue;
    if (lowest_open < 0) lowest_open = static_cast<int>(i);
    if (!streams[i].warm) continue;
    if (lowest_warm < 0) lowest_warm = static_cast<int>(i);
    ++warm_open;
    rates_known = rates_known && streams[i].pacing_bytes_per_s > 0;
  }
  if (warm_open == 0) {
    return lowest_open == static_cast<int>(self) ? ChunkChoice{true, -1} : ChunkChoice{false, lowest_open};
  }
  if (!rates_known) {
    return lowest_warm == static_cast<int>(self) ? ChunkChoice{true, -1} : ChunkChoice{false, lowest_warm};
  }
  auto finish = [&](uint32_t i) {
    return static_cast<double>(streams[i].backlog_bytes + bytes) /
           static_cast<double>(streams[i].pacing_bytes_per_s);
  };
  int best = -1;
  double best_s = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (!open(i) || !streams[i].warm) continue;
    const double t = finish(i);
    if (best < 0 || t < best_s) {
      best = static_cast<int>(i);
      best_s = t;
    }
  }
  if (!streams[self].warm) return {false, best};
  if (best == static_cast<int>(self) || finish(self) <= best_s * kChunkChoiceSlack) return {true, -1};
  return {false, best};
}

}  // namespace tern::tcp
