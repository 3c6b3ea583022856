#include "tools/wan/link.h"

#include <algorithm>

namespace tern::wan {

namespace {
// Serialization time in ns of `bytes` at `rate_bps`; 128-bit so that neither
// large packets nor low rates overflow.
uint64_t SerializeNs(uint64_t bytes, uint64_t rate_bps) {
  const unsigned __int128 bits_ns = static_cast<unsigned __int128>(bytes) * 8u * 1000000000u;
  return static_cast<uint64_t>((bits_ns + rate_bps - 1) / rate_bps);
}
}  // namespace

uint64_t Link::BacklogBytes(uint64_t now_ns) const {
  if (config_.rate_bps == 0 || busy_until_ns_ <= now_ns) return 0;
  const unsigned __int128 bits =
      static_cast<unsigned __int128>(busy_until_ns_ - now_ns) * config_.rate_bps / 1000000000u;
  return static_cast<uint64_t>(bits / 8u);
}

bool Link::Lose() {
  ++stats_.offered_packets;
  if (config_.loss > 0.0 && rng_.NextUnit() < config_.loss) {
    ++stats_.lost_packets;
    return true;
  }
  return false;
}

bool Link::Corrupt(uint64_t* where) {
  if (config_.corrupt <= 0.0 || corrupt_rng_.NextUnit() >= config_.corrupt) return false;
  *where = corrupt_rng_.Next();
  return true;
}

Verdict Link::Offer(uint64_t now_ns, uint64_t bytes, uint64_t* deliver_ns) {
  if (Lose()) return Verdict::kDropLoss;
  return Schedule(now_ns, bytes, 1, deliver_ns);
}

Verdict Link::Schedule(uint64_t now_ns, uint64_t bytes, uint64_t segments, uint64_t* deliver_ns) {
  uint64_t leave_ns = now_ns;
  if (config_.rate_bps != 0) {
    if (BacklogBytes(now_ns) + bytes > config_.queue_bytes) {
      stats_.queue_drop_packets += segments;
      return Verdict::kDropQueue;
    }
    busy_until_ns_ = std::max(busy_until_ns_, now_ns) + SerializeNs(bytes, config_.rate_bps);
    leave_ns = busy_until_ns_;
  }
  // max(): a caller clock that steps back must not reorder the FIFO.
  last_deliver_ns_ = std::max(last_deliver_ns_, leave_ns + config_.delay_us * 1000u);
  *deliver_ns = last_deliver_ns_;
  stats_.forwarded_packets += segments;
  stats_.forwarded_bytes += bytes;
  return Verdict::kForward;
}

}  // namespace tern::wan
