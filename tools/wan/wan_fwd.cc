// tern-wan-fwd: the user-space packet forwarder of the emulated WAN testbed
// (tools/wan/wan.sh). This kernel has no netem, so delay and loss happen
// here: the router namespace routes every packet between hosts into one TUN
// device; this process reads it, picks the link of its (source region,
// destination region) pair from the address 10.REGION.HOST.x, lets the link
// model (link.h) drop or schedule it, and writes it back into the TUN device
// at its delivery time, from where the kernel routes it to the destination.
//
// Memory is bounded: packets live in a pool of --pool_mb; when the pool is
// empty new packets are dropped and counted. Every loop has a bound.
// SIGUSR1 prints the per-link counters; SIGINT/SIGTERM print them and exit.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "tern/status.h"
#include "tools/cli_args.h"
#include "tools/wan/gso.h"
#include "tools/wan/link.h"

namespace tern::wan {
namespace {

constexpr int kReadBatch = 64;             // packets read before checking timers
constexpr uint64_t kEarlyNs = 50 * 1000;   // deliver this early to batch wake-ups
constexpr int kMaxRegion = 255;

volatile sig_atomic_t g_stop = 0;
volatile sig_atomic_t g_dump = 0;
void OnSignal(int sig) {
  if (sig == SIGUSR1)
    g_dump = 1;
  else
    g_stop = 1;
}

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// A packet as the TUN device carries it: VnetHdr, then the IPv4 packet.
struct Packet {
  std::unique_ptr<uint8_t[]> data;
  uint32_t bytes;
  uint64_t deliver_ns;
};

struct Lane {
  int src_region;
  int dst_region;
  Link link;
  std::deque<Packet> fifo;
  uint64_t corrupted_packets = 0;  // a payload bit flipped (LinkConfig::corrupt)
};
// A deque of lanes: growing it never copies a lane's packets.
using Lanes = std::deque<Lane>;

struct Counters {
  uint64_t unrouted_packets = 0;  // no link configured: forwarded at once
  uint64_t malformed_packets = 0;
  uint64_t pool_drop_packets = 0;  // over --pool_mb
  uint64_t split_packets = 0;      // super-packets cut up because of loss
  uint64_t write_errors = 0;
};

// "SRC,DST,delay_ms,rate_mbit,loss_pct,queue_kb[,corrupt_pct]"; queue_kb 0 =
// one round-trip bandwidth-delay product (at least 64 KiB).
Result<Lane> ParseLink(const std::string& spec, uint64_t seed) {
  double v[7] = {};
  const char* p = spec.c_str();
  for (int i = 0; i < 7; ++i) {
    char* end = nullptr;
    errno = 0;
    v[i] = std::strtod(p, &end);
    const bool last = *end == '\0' && i >= 5;
    TERN_REQUIRE(end != p && errno == 0 && (last || (*end == ',' && i < 6)), kInvalidArgument,
                 "link '", spec, "': want SRC,DST,delay_ms,rate_mbit,loss_pct,queue_kb[,corrupt_pct]");
    if (last) break;
    p = end + 1;
  }
  TERN_REQUIRE(v[0] >= 1 && v[0] <= kMaxRegion && v[1] >= 1 && v[1] <= kMaxRegion &&
                   v[0] == static_cast<int>(v[0]) && v[1] == static_cast<int>(v[1]),
               kOutOfRange, "link '", spec, "': regions are integers in 1..", kMaxRegion);
  TERN_REQUIRE(v[2] >= 0 && v[2] <= 10000, kOutOfRange, "link '", spec, "': delay_ms in 0..10000");
  TERN_REQUIRE(v[3] >= 0 && v[3] <= 100000, kOutOfRange, "link '", spec,
               "': rate_mbit in 0..100000 (0 = unlimited)");
  TERN_REQUIRE(v[4] >= 0 && v[4] < 100, kOutOfRange, "link '", spec, "': loss_pct in [0, 100)");
  TERN_REQUIRE(v[5] >= 0 && v[5] <= 4 * 1024 * 1024, kOutOfRange, "link '", spec,
               "': queue_kb in 0..4194304");
  TERN_REQUIRE(v[6] >= 0 && v[6] < 100, kOutOfRange, "link '", spec, "': corrupt_pct in [0, 100)");
  LinkConfig c;
  c.delay_us = static_cast<uint64_t>(v[2] * 1000.0 + 0.5);
  c.rate_bps = static_cast<uint64_t>(v[3] * 1e6 + 0.5);
  c.loss = v[4] / 100.0;
  c.queue_bytes = static_cast<uint64_t>(v[5] * 1024.0);
  c.corrupt = v[6] / 100.0;
  if (c.queue_bytes == 0) {
    const double bdp = static_cast<double>(c.rate_bps) / 8.0 * 2.0 * c.delay_us / 1e6;
    c.queue_bytes = std::max<uint64_t>(64 * 1024, static_cast<uint64_t>(bdp));
  }
  const int src = static_cast<int>(v[0]), dst = static_cast<int>(v[1]);
  return Lane{src, dst, Link(c, seed ^ (static_cast<uint64_t>(src) << 40) ^
                                    (static_cast<uint64_t>(dst) << 48)), {}, 0};
}

// IFF_VNET_HDR with TSO offload makes the kernel hand over TCP super-packets
// instead of segmenting them first: ~40x fewer reads and writes at high rates.
Result<int> OpenTun(const std::string& name, bool offload) {
  TERN_REQUIRE(!name.empty() && name.size() < IFNAMSIZ, kInvalidArgument, "bad --tun name '",
               name, "'");
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return TERN_ERRNO("open /dev/net/tun");
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI | IFF_VNET_HDR;
  std::memcpy(ifr.ifr_name, name.data(), name.size());
  int hdr_bytes = sizeof(VnetHdr);
  const unsigned offloads = offload ? TUN_F_CSUM | TUN_F_TSO4 : 0;
  if (ioctl(fd, TUNSETIFF, &ifr) < 0 || ioctl(fd, TUNSETVNETHDRSZ, &hdr_bytes) < 0 ||
      ioctl(fd, TUNSETOFFLOAD, offloads) < 0) {
    Status s = TERN_ERRNO("set up tun device ", name);
    close(fd);
    return s;
  }
  return fd;
}

void DumpStats(const Lanes& lanes, const Counters& c, FILE* out) {
  std::fprintf(out, "stats\n");
  for (const Lane& l : lanes) {
    const LinkStats& s = l.link.stats();
    std::fprintf(out,
                 "link %d->%d offered=%llu forwarded=%llu bytes=%llu lost=%llu queue_drops=%llu "
                 "in_flight=%zu corrupted=%llu\n",
                 l.src_region, l.dst_region, (unsigned long long)s.offered_packets,
                 (unsigned long long)s.forwarded_packets, (unsigned long long)s.forwarded_bytes,
                 (unsigned long long)s.lost_packets, (unsigned long long)s.queue_drop_packets,
                 l.fifo.size(), (unsigned long long)l.corrupted_packets);
  }
  std::fprintf(out,
               "other unrouted=%llu malformed=%llu pool_drops=%llu split=%llu write_errors=%llu\n",
               (unsigned long long)c.unrouted_packets, (unsigned long long)c.malformed_packets,
               (unsigned long long)c.pool_drop_packets, (unsigned long long)c.split_packets,
               (unsigned long long)c.write_errors);
  std::fflush(out);
}

class Forwarder {
 public:
  Forwarder(int tun_fd, Lanes lanes, uint64_t pool_bytes)
      : tun_fd_(tun_fd), lanes_(std::move(lanes)), pool_bytes_(pool_bytes) {
    lane_of_.fill(-1);
    for (size_t i = 0; i < lanes_.size(); ++i)
      lane_of_[lanes_[i].src_region << 8 | lanes_[i].dst_region] = static_cast<int>(i);
  }

  Status Run() {
    sigset_t block, orig;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGUSR1);
    // Signals arrive only inside ppoll, so no wake-up is ever lost.
    sigprocmask(SIG_BLOCK, &block, &orig);
    while (!g_stop) {
      if (g_dump) {
        g_dump = 0;
        DumpStats(lanes_, counters_, stderr);
      }
      Deliver(NowNs());
      bool more = false;
      TERN_RETURN_IF_ERROR(ReadBatch(&more));
      if (more) continue;
      const uint64_t now = NowNs();
      Deliver(now);
      uint64_t next = UINT64_MAX;
      for (const Lane& l : lanes_)
        if (!l.fifo.empty()) next = std::min(next, l.fifo.front().deliver_ns);
      timespec ts{}, *timeout = nullptr;
      if (next != UINT64_MAX) {
        const uint64_t wait = next > now + kEarlyNs ? next - now - kEarlyNs : 0;
        ts.tv_sec = static_cast<time_t>(wait / 1000000000u);
        ts.tv_nsec = static_cast<long>(wait % 1000000000u);
        timeout = &ts;
      }
      pollfd pfd{tun_fd_, POLLIN, 0};
      if (ppoll(&pfd, 1, timeout, &orig) < 0 && errno != EINTR) return TERN_ERRNO("ppoll");
      if (pfd.revents & (POLLERR | POLLHUP | POLLNVAL))
        return TERN_ERROR(kIo, "tun device closed or failed");
    }
    return Status::Ok();
  }

  const Lanes& lanes() const { return lanes_; }
  const Counters& counters() const { return counters_; }

 private:
  void Write(const uint8_t* data, size_t bytes) {
    if (write(tun_fd_, data, bytes) != static_cast<ssize_t>(bytes)) ++counters_.write_errors;
  }

  void Deliver(uint64_t now) {
    for (Lane& l : lanes_) {
      while (!l.fifo.empty() && l.fifo.front().deliver_ns <= now + kEarlyNs) {
        const Packet& p = l.fifo.front();
        Write(p.data.get(), p.bytes);
        pool_used_bytes_ -= p.bytes;
        l.fifo.pop_front();
      }
    }
  }

  // Reads up to kReadBatch packets; *more is true when the batch filled up.
  Status ReadBatch(bool* more) {
    *more = false;
    for (int i = 0; i < kReadBatch; ++i) {
      const ssize_t n = read(tun_fd_, scratch_.data(), scratch_.size());
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return Status::Ok();
        return TERN_ERRNO("read tun");
      }
      Route(static_cast<size_t>(n), NowNs());
    }
    *more = true;
    return Status::Ok();
  }

  // Queues a copy of `bytes` at deliver_ns on lane l, within the pool bound.
  void Enqueue(Lane& l, const uint8_t* data, size_t bytes, uint64_t deliver_ns) {
    if (pool_used_bytes_ + bytes > pool_bytes_) {
      ++counters_.pool_drop_packets;
      return;
    }
    auto copy = std::make_unique_for_overwrite<uint8_t[]>(bytes);
    std::memcpy(copy.get(), data, bytes);
    pool_used_bytes_ += bytes;
    l.fifo.push_back(Packet{std::move(copy), static_cast<uint32_t>(bytes), deliver_ns});
  }

  // Validates the untrusted packet in scratch_ and queues it (or the
  // segments that survive random loss) on the lane of its region pair.
  void Route(size_t n, uint64_t now) {
    uint8_t* pkt = scratch_.data();
    PacketShape shape;
    if (!ParseShape(pkt, n, &shape)) {
      ++counters_.malformed_packets;
      return;
    }
    const uint8_t* ip = pkt + sizeof(VnetHdr);
    const int src = ip[12] == 10 ? ip[13] : 0, dst = ip[16] == 10 ? ip[17] : 0;
    const int lane = lane_of_[src << 8 | dst];
    if (lane < 0) {
      ++counters_.unrouted_packets;
      Write(pkt, n);
      return;
    }
    Lane& l = lanes_[static_cast<size_t>(lane)];
    // Corruption first, drawn per wire segment: a super-packet cut up below
    // because of loss carries the flipped bits in its segments too.
    for (uint32_t k = 0; k < shape.segments; ++k) {
      uint64_t where = 0;
      if (l.link.Corrupt(&where) && CorruptTcpPayload(pkt, n, where)) ++l.corrupted_packets;
    }
    uint64_t deliver_ns = 0;
    if (shape.segments == 1) {
      if (l.link.Offer(now, shape.wire_bytes, &deliver_ns) == Verdict::kForward)
        Enqueue(l, pkt, n, deliver_ns);
      return;
    }
    std::vector<bool>& lost = lost_;
    lost.assign(shape.segments, false);
    uint32_t n_lost = 0;
    for (uint32_t k = 0; k < shape.segments; ++k) {
      lost[k] = l.link.Lose();
      n_lost += lost[k];
    }
    if (n_lost == 0) {
      if (l.link.Schedule(now, shape.wire_bytes, shape.segments, &deliver_ns) == Verdict::kForward)
        Enqueue(l, pkt, n, deliver_ns);
      return;
    }
    ++counters_.split_packets;
    for (uint32_t k = 0; k < shape.segments; ++k) {
      if (lost[k]) continue;
      const std::vector<uint8_t> seg = Segment(pkt, shape, k);
      if (l.link.Schedule(now, seg.size() - sizeof(VnetHdr), 1, &deliver_ns) == Verdict::kForward)
        Enqueue(l, seg.data(), seg.size(), deliver_ns);
    }
  }

  int tun_fd_;
  Lanes lanes_;
  uint64_t pool_bytes_;
  uint64_t pool_used_bytes_ = 0;
  Counters counters_;
  std::array<int, 1 << 16> lane_of_;
  std::array<uint8_t, sizeof(VnetHdr) + 65536> scratch_{};
  std::vector<bool> lost_;  // per segment of the super-packet being routed
};

struct Args {
  std::string tun;
  bool no_offload = false;
  uint64_t pool_mb = 0;
  uint64_t seed = 0;
  std::vector<std::string> links;
  Lanes lanes;  // from links, by Check
};

Status Check(Args& a) {
  TERN_REQUIRE(a.links.size() <= 4096, kOutOfRange, "too many links");
  std::array<bool, 1 << 16> seen{};
  for (const std::string& spec : a.links) {
    TERN_ASSIGN_OR_RETURN(Lane lane, ParseLink(spec, a.seed));
    const int key = lane.src_region << 8 | lane.dst_region;
    TERN_REQUIRE(!seen[key], kInvalidArgument, "link ", lane.src_region, "->", lane.dst_region,
                 " given twice");
    seen[key] = true;
    a.lanes.push_back(Lane{lane.src_region, lane.dst_region, lane.link, {}, 0});
  }
  return Status::Ok();
}

Status Forward(Args& a) {
  TERN_ASSIGN_OR_RETURN(int fd, OpenTun(a.tun, !a.no_offload));
  // Timer slack would add up to 50 us to every delay.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  auto fwd = std::make_unique<Forwarder>(fd, std::move(a.lanes), a.pool_mb << 20);
  std::fprintf(stderr, "tern-wan-fwd: forwarding on %s with %zu links\n", a.tun.c_str(),
               fwd->lanes().size());
  Status s = fwd->Run();
  DumpStats(fwd->lanes(), fwd->counters(), stdout);
  close(fd);
  return s;
}

}  // namespace
}  // namespace tern::wan

int main(int argc, char** argv) {
  using namespace tern;
  CLI::App app("Delays, rate-limits and drops packets between the regions of the emulated WAN "
               "(tools/wan/wan.sh starts it in the router namespace).",
               "tern-wan-fwd");
  cli::Configure(app);
  wan::Args a;
  app.add_option("--tun", a.tun, "TUN device to attach to (created by wan.sh)")->required();
  app.add_flag("--no_offload", a.no_offload,
               "have the kernel cut TCP super-packets into MTU-sized packets before the "
               "forwarder sees them (more faithful, much slower)");
  cli::AddUnsigned(app, "--pool_mb", a.pool_mb,
                   "memory for queued and in-flight packets; excess is dropped (1..65536)", "256")
      ->check(CLI::Range(uint64_t{1}, uint64_t{65536}).description(""));
  cli::AddUnsigned(app, "--seed", a.seed, "seed of the random loss", "1");
  app.add_option("LINK", a.links,
                 "SRC,DST,delay_ms,rate_mbit,loss_pct,queue_kb[,corrupt_pct] (one direction; "
                 "regions are the second octet of 10.R.H.x; rate 0 = unlimited; queue 0 = one "
                 "round-trip BDP; corrupt_pct: TCP segments with one payload bit flipped past "
                 "TCP's checksum)");
  cli::Dispatch dispatch;
  dispatch.On(&app, {[&] { return wan::Check(a); }, [&] { return wan::Forward(a); }});
  return dispatch.Run(app, argc, argv);
}
