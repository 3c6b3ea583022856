// Internals of the raw-verbs backend, shared by verbs.cc (device, memory,
// progress thread, listener, dialler, side-channel handshake) and
// verbs_conn.cc (one queue pair). Not a public header.
//
// Threading: completions of every connection are handled on the transport's
// single progress thread, which sleeps in poll() on each connection's
// completion channel and side-channel socket (and an eventfd for commands).
// Work requests are posted from any thread under the connection's mutex;
// user callbacks never run with a lock held.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "tern/verbs_transport.h"
#include "transport/internal.h"
#include "transport/window_table.h"
#include "transport/net/socket.h"
#include "transport/verbs/ibv_api.h"
#include "transport/verbs/qp.h"
#include "transport/verbs/wire.h"

namespace tern::verbs {

class VerbsTransport;

// What a work request's wr_id names: the kind in the top byte, an index or
// id below.
enum class WrKind : uint8_t { kRecv = 1, kSend = 2, kRead = 3, kWrite = 4 };
inline uint64_t WrId(WrKind kind, uint64_t id) { return (uint64_t{static_cast<uint8_t>(kind)} << 56) | id; }
inline WrKind WrKindOf(uint64_t wr_id) { return static_cast<WrKind>(wr_id >> 56); }
inline uint64_t WrIndex(uint64_t wr_id) { return wr_id & ((uint64_t{1} << 56) - 1); }

class VerbsConn final : public Connection, public std::enable_shared_from_this<VerbsConn> {
 public:
  VerbsConn(VerbsTransport* transport, std::string peer);
  ~VerbsConn() override;

  // ---- set-up (the handshake thread, before Register) ----
  // Completion channel, CQ, RC queue pair moved to INIT, control buffers
  // registered and every receive posted.
  Status Create();
  QpEndpoint LocalEndpoint() const { return local_; }
  // INIT -> RTR -> RTS towards the peer's endpoint.
  Status BringUp(const QpEndpoint& remote);
  // Any time: the listener sets them after on_accept returned, while the
  // connection may already be closing (then on_closed fires from here).
  void SetHandlers(ConnectionHandlers handlers);
  // The side channel's socket, kept open for the connection's life.
  void AdoptSide(std::unique_ptr<net::Pipe> side) { side_ = std::move(side); }
  int side_fd() const { return side_ ? side_->fd() : -1; }

  // ---- Connection ----
  std::string peer_address() const override { return peer_; }
  uint32_t capabilities() const override;
  std::string Describe() const override;
  void SendMessage(std::string payload, Completion done) override;
  void SendChunk(const ChunkSend& chunk, Completion done) override;
  Status PostReceive(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
                     uint64_t length_bytes, ChunkLanded on_landed) override;
  void CancelReceive(uint64_t transfer_id) override;
  Result<std::string> ExportRegion(const MemoryRegion& region) override;
  void Write(const MemoryRegion& src, uint64_t src_offset, std::string_view remote_key,
             uint64_t dst_offset, uint64_t length, Completion done) override;
  void Close() override;

  // ---- progress thread only ----
  // Arms the CQ and drains what arrived before; deliveries start.
  void Open();
  bool polling() const { return opened_ || shut_; }
  int channel_fd() const;
  // The completion channel is readable: take its events, re-arm, drain.
  void OnChannelReadable();
  // Polls the CQ (at most a bounded number of completions), handling each;
  // then releases the connection if it is shut down and flushed.
  void DrainCq();
  // Completions were left in the CQ by the bound: drain again soon.
  bool backlog() const { return backlog_; }
  // The side channel is readable: a peer leaving (EOF) or talking out of
  // turn (a protocol error).
  void OnSideReadable();
  void CheckDeadlines(uint64_t now_us);
  // Ends the connection once: no window is written and no operation starts
  // from here on. With `bye` a bye goes out first (a bounded wait for its
  // send completion). Then the queue pair moves to ERR and, once every
  // posted work request is flushed (or a bounded wait gave up), resources
  // are freed, pending work fails with `pending_code` and on_closed(why)
  // fires. Idempotent.
  void Shutdown(Status why, Code pending_code, bool bye);
  // Whether Shutdown finished (the transport drops the connection then).
  bool released() const;
  // Transport teardown: frees everything now.
  void Abandon();

 private:
  struct Outgoing {
    ControlHeader header;
    std::string payload;
    // Messages: fragments cut from `payload` as credits allow.
    uint64_t offset = 0;
    bool message = false;
    Completion done;  // a message's, fired when its last fragment was sent
    uint64_t queued_us = 0;
  };
  // A chunk being pulled into a window by an RDMA READ.
  struct Landing {
    uint64_t op = 0, xxh3 = 0;
    transport::Landing window;  // handle: the window memory's lkey
    uint64_t remote_address = 0;
    uint32_t rkey = 0;
    bool posted = false;  // the read is on the wire (the NIC may write the window)
  };
  struct PendingOp {
    Completion done;
    uint64_t deadline_us = 0;
    bool ackable = false;  // a chunk (the peer acks it), not a Write
  };
  struct PendingWrite {
    uint64_t op = 0;
    uint64_t local_address = 0, length = 0, remote_address = 0;
    uint32_t lkey = 0, rkey = 0;
  };
  using Deferred = std::vector<std::function<void()>>;

  // Admits one more operation (bounded) unless closed; locked.
  Status AdmitLocked() REQUIRES(mu_);
  // Posts what credits, send buffers and queue slots allow; locked. Errors
  // from posting end the connection (via the progress thread).
  void PumpLocked() REQUIRES(mu_);
  Status PostControlLocked(Outgoing& out, bool* finished) REQUIRES(mu_);
  Status PostRdmaLocked(WrKind kind, uint64_t id, uint64_t local_address, uint64_t length,
                        uint32_t lkey, uint64_t remote_address, uint32_t rkey) REQUIRES(mu_);
  void QueueAckLocked(uint64_t op, const Status& status) REQUIRES(mu_);
  bool RepostReceiveLocked(uint64_t index) REQUIRES(mu_);
  void FailOutboxLocked() REQUIRES(mu_);
  void TryPostByeLocked() REQUIRES(mu_);
  void OnCompletion(const ibv_wc& wc, Deferred* deferred);
  void OnReceive(uint64_t index, uint32_t byte_len, Deferred* deferred);
  void OnReadDone(uint64_t id, bool ok);
  void FinishOpLocked(uint64_t op, Status status, Deferred* deferred) REQUIRES(mu_);
  // QP to ERR: every posted work request completes (flushed).
  void MoveToError();
  void MaybeRelease();
  // Resources freed, pending work failed, on_closed fired (once).
  void Release();
  bool DrainedLocked() const REQUIRES(mu_);
  void DestroyResources();
  uint8_t* RecvBuffer(uint64_t i) const;
  uint8_t* SendBuffer(uint64_t i) const;

  VerbsTransport* const t_;
  const std::string peer_;
  std::unique_ptr<net::Pipe> side_;
  const uint32_t recv_count_;
  const uint32_t send_count_;
  const uint32_t sq_depth_;

  // Device objects (created in Create, freed in Release/Abandon).
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* buffers_mr_ = nullptr;
  std::unique_ptr<uint8_t[]> buffers_;  // recv_count_ + send_count_ control buffers
  QpEndpoint local_;
  QpEndpoint remote_;
  ConnectionHandlers handlers_;

  // Progress thread only.
  bool opened_ = false;
  bool shut_ = false;
  bool bye_seen_ = false;
  uint64_t eof_deadline_us_ = 0;   // the side channel closed: wait this long for a bye
  uint64_t drain_deadline_us_ = 0;  // Shutdown: bye send / flush bound
  bool bye_wait_ = false;           // Shutdown waits for our bye's send completion
  bool flushing_ = false;           // the QP is in ERR; waiting for the flush
  bool release_started_ = false;
  bool backlog_ = false;
  std::vector<Completion> unsent_;  // messages that never left, failed on release
  Status why_;
  Code pending_code_ = Code::kCancelled;
  MessageAssembler assembler_;
  uint64_t next_deadline_check_us_ = 0;

  // The connection's state shared by the API threads (posting work,
  // Close, Describe), the handshake thread (SetHandlers) and the progress
  // thread (completions, Shutdown, Release). Under it only windows_'s lock
  // and the transport's cmd_mu_ (PumpLocked posts a shutdown) are taken;
  // user callbacks never run under it (Deferred work runs after it is let
  // go). The device objects above are set before Register and freed by
  // the progress thread after qp_gone_, so they carry no lock.
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  LinkState link_ GUARDED_BY(mu_) = LinkState::kIdle;
  bool closed_ GUARDED_BY(mu_) = false;    // no new work; windows no longer written
  bool qp_gone_ GUARDED_BY(mu_) = false;   // Release began: nothing is posted any more
  bool released_ GUARDED_BY(mu_) = false;  // resources gone, completions fired
  int64_t bye_slot_ GUARDED_BY(mu_) = -1;  // the send buffer carrying our bye
  bool bye_pending_ GUARDED_BY(mu_) = false;  // Shutdown wants a bye out; waiting for a slot
  bool handlers_set_ GUARDED_BY(mu_) = false;
  bool closed_unannounced_ GUARDED_BY(mu_) = false;  // released before SetHandlers
  Status closed_why_ GUARDED_BY(mu_);
  uint32_t send_credits_ GUARDED_BY(mu_) = 0;  // receives the peer has posted for us
  uint32_t owed_credits_ GUARDED_BY(mu_) = 0;  // receives we re-posted and have not reported
  bool credit_queued_ GUARDED_BY(mu_) = false;
  uint32_t sq_free_ GUARDED_BY(mu_) = 0;
  uint32_t recv_posted_ GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> free_send_ GUARDED_BY(mu_);
  std::map<uint64_t, Completion> send_done_ GUARDED_BY(mu_);  // send buffer -> message completion
  std::deque<Outgoing> outbox_ GUARDED_BY(mu_);
  std::deque<PendingWrite> writes_ GUARDED_BY(mu_);
  uint32_t writes_posted_ GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> read_queue_ GUARDED_BY(mu_);  // landings waiting for a read slot
  uint32_t reads_posted_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Landing> landings_ GUARDED_BY(mu_);  // id -> landing (queued or posted)
  uint64_t next_landing_ GUARDED_BY(mu_) = 1;
  uint32_t in_flight_ GUARDED_BY(mu_) = 0;
  uint64_t next_op_ GUARDED_BY(mu_) = 1;
  uint64_t next_message_seq_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, PendingOp> pending_ GUARDED_BY(mu_);
  transport::WindowTable windows_{"verbs"};
};

struct ListenState;

class VerbsTransport final : public Transport {
 public:
  VerbsTransport(VerbsOptions options, Clock& clock);
  ~VerbsTransport() override;
  Status Init();

  std::string name() const override { return "verbs"; }
  uint32_t capabilities() const override {
    return kCapOneSidedWrite | kCapCrossHost | kCapChunkChecksum;
  }
  Result<MemoryRegion> RegisterMemory(void* base, uint64_t size_bytes, MemoryKind kind) override;
  Status DeregisterMemory(const MemoryRegion& region) override;
  Result<std::unique_ptr<Listener>> Listen(const std::string& address,
                                           AcceptHandler on_accept) override;
  void Connect(const std::string& address, ConnectionHandlers handlers, ConnectDone done) override;

  // ---- for VerbsConn and the handshakes ----
  const IbvApi& api() const { return *api_; }
  const VerbsOptions& options() const { return options_; }
  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  bool ethernet() const { return ethernet_; }
  uint16_t lid() const { return lid_; }
  uint32_t mtu_bytes() const { return mtu_bytes_; }
  const uint8_t* gid() const { return gid_; }
  uint8_t rd_atomic() const { return rd_atomic_; }
  uint64_t max_message_bytes() const { return max_msg_bytes_; }
  const std::string& device_name() const { return device_name_; }
  uint64_t NowUs() const { return clock_.NowUs(); }
  void Log(std::string_view line) const { transport::LogLine(options_.log, line); }
  bool OnProgressThread() const { return std::this_thread::get_id() == thread_id_.load(); }

  struct LocalMemory {
    uint8_t* base;
    uint64_t size_bytes;
    uint32_t lkey, rkey;
  };
  // The registration behind a region, checked against its base and size.
  Result<LocalMemory> Lookup(const MemoryRegion& region) const;

  // Any thread: runs fn on the progress thread (FIFO).
  void Post(std::function<void()> fn);
  // Adds a connection to the progress thread (not yet polled until Open).
  void Register(std::shared_ptr<VerbsConn> conn);
  // Connections counted against max_connections.
  bool AdmitConnection();
  void ConnectionGone();

  // The side-channel handshakes (handshake threads).
  void ServeHandshake(std::shared_ptr<ListenState> state, int fd);
  Result<std::shared_ptr<VerbsConn>> DialHandshake(const std::string& address, int fd,
                                                   uint64_t deadline_us);

 private:
  struct Registration {
    uint8_t* base;
    uint64_t size_bytes;
    ibv_mr* mr;
  };

  void Run();
  void AcceptLoop(std::shared_ptr<ListenState> state);

  const VerbsOptions options_;
  Clock& clock_;
  std::shared_ptr<const IbvApi> api_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::string device_name_;
  uint8_t port_ = 1;
  bool ethernet_ = false;
  uint16_t lid_ = 0;
  uint32_t mtu_bytes_ = 4096;
  uint8_t gid_[16] = {};
  uint8_t rd_atomic_ = 1;
  uint64_t max_msg_bytes_ = uint64_t{1} << 30;

  // Registrations: any thread registers and looks up. A leaf lock.
  mutable Mutex reg_mu_;
  std::map<uint64_t, Registration> registrations_ GUARDED_BY(reg_mu_);
  uint64_t next_handle_ GUARDED_BY(reg_mu_) = 1;

  std::atomic<uint32_t> connections_{0};

  // The command queue into the progress thread. A leaf lock: commands run
  // after they are taken off the queue.
  Mutex cmd_mu_;
  std::deque<std::function<void()>> commands_ GUARDED_BY(cmd_mu_);
  bool stop_ GUARDED_BY(cmd_mu_) = false;
  int wake_fd_ = -1;

  // Progress thread only.
  std::vector<std::shared_ptr<VerbsConn>> conns_;

  // Listeners, added by Listen and closed by the destructor. A leaf lock.
  Mutex listen_mu_;
  std::vector<std::shared_ptr<ListenState>> listens_ GUARDED_BY(listen_mu_);

  transport::ThreadTracker threads_;  // accept and handshake threads
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_;
};

}  // namespace tern::verbs
