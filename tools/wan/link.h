// The emulated link between two regions, one direction: a drop-tail queue
// drained at a fixed rate, then a fixed propagation delay, with independent
// random loss. Pure arithmetic on caller-supplied times, so it is testable
// without packets or clocks; the forwarder (wan_fwd.cc) owns the packets.
//
// Model, per packet of `bytes` offered at `now_ns`:
//   1. lost with probability loss (seeded, per link: the drop pattern depends
//      only on the link's own packet sequence, not on other links' traffic);
//   2. otherwise it waits behind the backlog; if the backlog plus the packet
//      would exceed queue_bytes it is dropped (drop-tail, like a router);
//   3. it leaves the queue after its serialization time bytes*8/rate and is
//      delivered delay later. Delivery times never decrease, so one FIFO per
//      link suffices.
// rate_bps == 0 means unlimited (no queue, delay and loss only).
//
// Thread safety: none; one Link belongs to one forwarder thread.
#pragma once

#include <cstdint>

namespace tern::wan {

struct LinkConfig {
  uint64_t delay_us = 0;
  uint64_t rate_bps = 0;  // bits per second of IP packet bytes; 0 = unlimited
  double loss = 0.0;      // probability in [0, 1)
  uint64_t queue_bytes = 0;
  double corrupt = 0.0;  // probability per wire segment of a flipped payload bit, in [0, 1)
};

// SplitMix64: small, seedable and good enough for Bernoulli drops.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 bits.
  double NextUnit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

enum class Verdict { kForward, kDropLoss, kDropQueue };

struct LinkStats {
  uint64_t offered_packets = 0;
  uint64_t forwarded_packets = 0;
  uint64_t forwarded_bytes = 0;
  uint64_t lost_packets = 0;       // random loss
  uint64_t queue_drop_packets = 0;  // drop-tail
};

class Link {
 public:
  Link(const LinkConfig& config, uint64_t seed)
      : config_(config), rng_(seed), corrupt_rng_(seed ^ 0xC0227D7C0227D7ull) {}

  // Decides the fate of one packet; on kForward *deliver_ns is its delivery
  // time (>= every earlier delivery time on this link).
  Verdict Offer(uint64_t now_ns, uint64_t bytes, uint64_t* deliver_ns);

  // The two halves of Offer, for a TCP super-packet (GSO) that stands for
  // `segments` wire packets: Lose() draws the random loss of one segment;
  // Schedule() queues the survivors' bytes as one burst (drop-tail as a
  // whole).
  bool Lose();
  // Whether one wire segment is corrupted, and where (a random word for
  // CorruptTcpPayload). Its own stream: a link's loss pattern is the same
  // with or without corruption; no draw at all when corrupt is 0.
  bool Corrupt(uint64_t* where);
  Verdict Schedule(uint64_t now_ns, uint64_t bytes, uint64_t segments, uint64_t* deliver_ns);

  // Bytes waiting for serialization at now_ns (not those in propagation).
  uint64_t BacklogBytes(uint64_t now_ns) const;

  const LinkConfig& config() const { return config_; }
  const LinkStats& stats() const { return stats_; }

 private:
  LinkConfig config_;
  Rng rng_;
  Rng corrupt_rng_;
  LinkStats stats_;
  uint64_t busy_until_ns_ = 0;  // when the queue drains if nothing else arrives
  uint64_t last_deliver_ns_ = 0;
};

}  // namespace tern::wan
