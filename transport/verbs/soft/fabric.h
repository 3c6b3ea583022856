// softverbs internals: the objects behind the ibv_* handles and the
// process-global fabric that moves bytes between queue pairs.
//
// libibverbs' ABI hands out bare pointers and has no place to pass an
// environment in, so the fabric is the one process-global of this library
// (a device is process-global in the real one too). Every object below is
// guarded by Fabric::mu; the worker thread drops it only around large
// copies, while `copying` is set (destroy and deregister wait for that).
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/verbs/soft/softverbs.h"

namespace tern::softverbs {

using Clock = std::chrono::steady_clock;

inline constexpr uint32_t kMaxQpWr = 16384;
inline constexpr uint32_t kMaxSge = 4;
inline constexpr uint32_t kMaxInlineBytes = 256;
inline constexpr int kMaxCqe = 65536;
inline constexpr uint8_t kMaxRdAtomic = 16;
inline constexpr uint64_t kMaxMrBytes = uint64_t{1} << 40;
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 31;  // port max_msg_sz
inline constexpr uint16_t kPortLid = 1;
// Copies above this size run with the fabric lock released.
inline constexpr size_t kUnlockedCopyBytes = 64 * 1024;
// Completion opcode of error completions: real providers leave it undefined,
// so code that switches on it for a failed WR is wrong; this makes it show.
inline constexpr ibv_wc_opcode kPoisonOpcode = static_cast<ibv_wc_opcode>(0xff);

struct Cq;

// Every handle counts in its context, so close_device can refuse leaks.
struct Ctx {
  verbs_context vctx;  // ibv_context is vctx.context
  int objects = 0;
};

struct Pd {
  ibv_pd pd;      // first member: the ibv_pd* handed out is this object
  int users = 0;  // MRs and QPs on it
};

struct Mr {
  ibv_mr mr;
  int access = 0;
};

struct Channel {
  ibv_comp_channel ch;     // ch.fd: an eventfd in semaphore mode
  std::deque<Cq*> events;  // one entry per pending event, in order
  int cqs = 0;
};

struct Completion {
  ibv_wc wc{};
  uint32_t send_slots = 0;  // send-queue slots freed when this is polled
  uint32_t recv_slots = 0;
};

struct Cq {
  ibv_cq cq;
  Channel* channel = nullptr;
  std::deque<Completion> entries;  // at most cq.cqe
  bool armed = false;
  bool overrun = false;
  uint32_t events_unacked = 0;  // got with get_cq_event, not yet acked
  int qps = 0;
};

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

struct SendWqe {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  bool signaled = false;
  bool is_inline = false;
  uint32_t imm = 0;  // network byte order, as posted
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  std::vector<Sge> sges;
  std::vector<uint8_t> inline_data;  // copied at post time
  uint64_t Bytes() const;
};

struct RecvWqe {
  uint64_t wr_id = 0;
  std::vector<Sge> sges;
};

struct Qp {
  ibv_qp qp;
  // The QP's real state. qp.state is what the caller last set with
  // modify_qp: like rdma-core, an error the hardware hits (a failed WR, a
  // CQ overrun, a broken link) does not show there.
  ibv_qp_state state = IBV_QPS_RESET;
  Pd* pd = nullptr;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  ibv_qp_cap cap{};
  bool sq_sig_all = false;

  // Attributes from modify_qp.
  unsigned access = 0;
  uint32_t dest_qpn = 0;
  uint32_t rq_psn = 0, sq_psn = 0;
  uint8_t max_rd_atomic = 0, max_dest_rd_atomic = 0;
  uint8_t rnr_retry = 0, retry_cnt = 0, timeout = 0, min_rnr_timer = 0;
  ibv_mtu path_mtu = IBV_MTU_256;
  ibv_ah_attr ah{};

  std::deque<SendWqe> sq;  // posted, not executed yet
  std::deque<RecvWqe> rq;  // posted, not consumed yet
  // Posted WRs whose slots are still taken: a send slot is freed when the
  // completion that retires it is polled; unsignaled WRs are retired by the
  // next signaled completion of this QP (real hardware frees slots so).
  uint32_t sq_used = 0, rq_used = 0;
  uint32_t unsignaled_done = 0;

  // Progress of the head send WR while it cannot run.
  bool head_blocked = false;
  Clock::time_point head_since{};
  Clock::time_point next_try{};
  uint32_t rnr_attempts = 0;
};

class Fabric {
 public:
  Fabric();
  ~Fabric();

  ibv_device* device() { return &device_; }

  // open_device/close_device: the worker runs while any context is open.
  void AddContext();
  void RemoveContext();

  uint32_t NewQpnLocked();
  uint32_t NewKeyLocked() { return next_key_++; }
  Qp* FindQpLocked(uint32_t qpn);

  void MoveToErrorLocked(Qp* qp);
  // Drops a QP's queued WRs and its completions still in the CQs (what
  // RESET and destroy do on real providers).
  void PurgeLocked(Qp* qp);
  // Waits until the worker is not copying with the lock released, so that
  // the caller may free objects a copy could touch.
  void WaitIdleLocked(std::unique_lock<std::mutex>& lock);
  void Wake() { work_cv_.notify_all(); }

  // Re-reads TERN_SOFTVERBS_LINK and TERN_SOFTVERBS_RETRY_MS. Called from
  // the verbs callers' threads (open, query, modify), never from the worker,
  // so a test's setenv() cannot race a getenv() here.
  void ReadEnvLocked();

  std::mutex mu;
  bool roce = false;  // port link layer Ethernet
  std::chrono::milliseconds retry_timeout{100};
  std::map<uint32_t, Qp*> qps;
  std::map<uint32_t, Mr*> lkeys, rkeys;
  tern_softverbs_counters stats{};

 private:
  void Run();
  bool HasWorkLocked(const Qp& qp) const;
  void FlushLocked(Qp* qp);
  // Executes or advances the head send WR of an RTS queue pair; returns
  // whether it finished (completed or failed).
  bool StepHeadLocked(std::unique_lock<std::mutex>& lock, Qp* qp);
  void PushLocked(Cq* cq, const Completion& c);
  void CompleteSendLocked(Qp* qp, const SendWqe& w, ibv_wc_status status, uint32_t byte_len);
  bool ReachableLocked(const Qp* qp, const Qp* dst) const;

  ibv_device device_{};
  std::mutex life_mu_;  // serializes worker start/stop
  int contexts_ = 0;
  std::thread worker_;
  bool stop_ = false;
  bool copying_ = false;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  uint32_t next_qpn_ = 0x000100;
  uint32_t next_key_ = 0x1000;
};

Fabric& TheFabric();

// The GID at index 0 of the port (IB: link-local from the port GUID;
// RoCE: the IPv4-mapped 127.0.0.1).
ibv_gid PortGid(bool roce);

}  // namespace tern::softverbs
