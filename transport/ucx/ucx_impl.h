// Internals of the UCX backend, shared by ucx.cc (context, worker, progress
// thread, listeners) and ucx_conn.cc (one endpoint). Not a public header.
//
// Threading: the worker is UCP_THREAD_MODE_SINGLE and only the progress
// thread calls into it. Public methods post commands to that thread. UCX
// callbacks do the minimum and queue the rest (user callbacks included) as
// "deferred" work that the progress thread runs outside of UCX, so user code
// never runs inside UCX and may call back into the transport.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "tern/ucx_transport.h"
#include "transport/internal.h"
#include "transport/window_table.h"
#include "transport/ucx/wire.h"

namespace tern::ucx {

class UcxTransport;

// A ucs_status_t as a tern Status ("ucx: <what>: Connection reset by remote peer").
Status FromUcs(ucs_status_t status, std::string_view what);

struct PendingOp {
  Completion done;
  uint64_t deadline_us = 0;
};

class UcxConn final : public Connection, public std::enable_shared_from_this<UcxConn> {
 public:
  enum class State { kConnecting, kAwaitHello, kOpen, kClosed };

  UcxConn(UcxTransport* transport, std::string peer, State state, uint64_t deadline_us);

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
  // Active-message arrivals (data_desc is UCX's when rndv is true).
  void OnHello(std::string_view header);
  void OnHelloAck(std::string_view header, std::string_view reason);
  ucs_status_t OnMessage(std::string_view header, void* data, size_t length, bool rndv);
  ucs_status_t OnChunk(std::string_view header, void* data, size_t length, bool rndv);
  void OnAck(std::string_view header, std::string_view reason);
  // How Shutdown leaves the peer.
  enum class Bye {
    kNone,       // just close (force where the error mode allows)
    kNoneFlush,  // close after what is queued reached the peer
    kSend,       // we close: bye, then wait (bounded) for the peer's answer
    kAnswer,     // the peer closed: answer with a bye, flush, close
  };
  // Ends the connection once: no window is written and no new operation
  // starts from here on; the endpoint closes (after the bye exchange for
  // kSend), and once UCX has released it (or a bounded wait gave up),
  // pending work fails with `pending_code` and `why` goes to on_closed /
  // ConnectDone, so a completion means UCX is done with that memory.
  void Shutdown(Status why, Code pending_code, Bye bye);
  void CheckDeadlines(uint64_t now_us);
  // After our bye we keep the endpoint until the peer's bye (or its
  // disconnect, or a bounded wait) so our bye is not overtaken by the
  // disconnect travelling another lane; then the endpoint closes.
  bool closing() const { return closing_; }
  void ByeAnswered();
  // Transport teardown: closes the endpoint now, without waiting for a bye
  // answer or a drain.
  void Abandon();
  // The endpoint is closed (UCX released it) or we gave up waiting: runs
  // the completions Shutdown held back and wakes Close(). Idempotent.
  void Released();
  void SendHello();
  // Records which UCX transports (lanes) this endpoint ended up using.
  void RecordLanes();

  ucp_ep_h ep = nullptr;
  State state;
  ConnectDone connect_done;                  // client, until open
  std::shared_ptr<transport::AcceptGate> on_accept;  // server, until open
  ConnectionHandlers handlers;

 private:
  struct Landing;

  // Admits one more operation in flight (bounded) unless closed.
  Status Admit();
  void Release();
  uint64_t AddPending(Completion done);
  void FinishOp(uint64_t op, Status status);
  void SendAck(uint64_t op, const Status& status);
  void Deliver(uint64_t seq, std::string payload);
  void FinishLanding(std::unique_ptr<Landing> landing, Status status);
  void ProtocolError(const Status& why);
  // Answers a hello with a refusal carrying `why`, then closes.
  void RefuseHello(const Status& why);
  void CloseEndpoint(bool flush);
  // Closes the endpoint now (after any drain).
  void CloseEndpointNow(bool flush);
  // A rendezvous receive of this endpoint finished (counted ones only).
  void RndvDone();
  // Sends one active message; `keep` (header/payload owner) lives until UCX is
  // done with the buffers; on_sent(status) runs deferred.
  void SendAm(unsigned id, std::string_view header, const void* data, size_t length,
              ucp_mem_h memh, std::shared_ptr<void> keep, std::function<void(Status)> on_sent);

  UcxTransport* const t_;
  const std::string peer_;
  uint64_t deadline_us_;  // handshake / connect / bye-answer / release deadline (progress thread)
  bool shut_ = false;     // Shutdown ran (progress thread)
  bool closing_ = false;  // our bye is out, the endpoint still open (progress thread)
  // Rendezvous receives in flight; a flush close waits (bounded) for them,
  // since UCX 1.13 aborts when it destroys an endpoint that still has one.
  uint64_t rndv_in_flight_ = 0;
  bool draining_ = false;
  std::function<void()> finish_;  // completions held until Released (progress thread)
  uint64_t next_send_seq_ = 0;
  uint64_t next_recv_seq_ = 0;
  std::map<uint64_t, std::string> reorder_;
  uint64_t inbound_bytes_ = 0;

  // What any thread reads: the API side (Admit, Close, Describe) and the
  // progress thread (acks, deadlines, Shutdown, Released) meet here. A leaf
  // lock: nothing is called under it (completions run after it is let go).
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  std::string lanes_ GUARDED_BY(mu_);  // "tcp/lo posix/memory", set once open
  bool closed_ GUARDED_BY(mu_) = false;
  bool released_ GUARDED_BY(mu_) = false;  // the endpoint is gone; Close() waits for this
  uint32_t in_flight_ GUARDED_BY(mu_) = 0;
  uint64_t next_op_ GUARDED_BY(mu_) = 1;
  std::map<uint64_t, PendingOp> pending_ GUARDED_BY(mu_);
  // Handle: the window memory's ucp_mem_h (rendezvous receives need it).
  transport::WindowTable windows_{"ucx"};
};

struct ListenState {
  std::atomic<bool> closed{false};
  std::shared_ptr<transport::AcceptGate> on_accept;
  UcxTransport* transport = nullptr;
  ucp_listener_h listener = nullptr;  // progress thread
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(UcxOptions options, Clock& clock);
  ~UcxTransport() override;
  Status Init();

  std::string name() const override { return "ucx"; }
  uint32_t capabilities() const override;
  Result<MemoryRegion> RegisterMemory(void* base, uint64_t size_bytes, MemoryKind kind) override;
  Status DeregisterMemory(const MemoryRegion& region) override;
  Result<std::unique_ptr<Listener>> Listen(const std::string& address,
                                           AcceptHandler on_accept) override;
  void Connect(const std::string& address, ConnectionHandlers handlers, ConnectDone done) override;

  // Any thread: runs fn on the progress thread (FIFO).
  void Post(std::function<void()> fn);
  // Any thread: runs fn on the progress thread and waits for it (inline when
  // called on that thread).
  void RunSync(const std::function<void()>& fn);
  // Progress thread: runs fn after the current UCX progress call returns.
  void Defer(std::function<void()> fn) { deferred_.push_back(std::move(fn)); }
  bool OnProgressThread() const { return std::this_thread::get_id() == thread_id_.load(); }

  // The registration behind a region, checked against its base and size.
  Result<ucp_mem_h> Lookup(const MemoryRegion& region) const;
  Result<std::string> PackKey(const MemoryRegion& region);

  void Log(std::string_view line) const { transport::LogLine(options_.log, line); }
  uint64_t NowUs() const { return clock_.NowUs(); }
  const UcxOptions& options() const { return options_; }
  ucp_worker_h worker() const { return worker_; }
  // Progress thread.
  void Forget(ucp_ep_h ep) { eps_.erase(ep); }
  // Closes conn's endpoint (flush mode, or force where the error mode allows
  // it); conn->Released() runs once UCX has finished the close.
  void CloseEp(const std::shared_ptr<UcxConn>& conn, ucp_ep_h ep, bool flush);
  void EpClosed(const std::shared_ptr<UcxConn>& conn);
  void Accept(ListenState* state, ucp_conn_request_h request);
  UcxConn* Find(ucp_ep_h ep);
  ucp_err_handling_mode_t ErrMode() const {
    return options_.detect_peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  }

 private:
  struct Registration {
    void* base;
    uint64_t size_bytes;
    MemoryKind kind;
    ucp_mem_h memh;
  };

  void Run();
  void RunCommandsAndDeferred();

  const UcxOptions options_;
  Clock& clock_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  bool cuda_ = false;
  int worker_fd_ = -1;
  int wake_fd_ = -1;

  // Registrations: any thread registers and looks up (Lookup from the
  // progress thread too). A leaf lock.
  mutable Mutex reg_mu_;
  std::map<uint64_t, Registration> registrations_ GUARDED_BY(reg_mu_);
  uint64_t next_handle_ GUARDED_BY(reg_mu_) = 1;

  // The command queue into the progress thread. A leaf lock: commands run
  // after they are taken off the queue, never under it.
  Mutex cmd_mu_;
  std::deque<std::function<void()>> commands_ GUARDED_BY(cmd_mu_);
  bool stop_ GUARDED_BY(cmd_mu_) = false;

  // Progress thread only.
  std::vector<std::function<void()>> deferred_;
  std::unordered_map<ucp_ep_h, std::shared_ptr<UcxConn>> eps_;
  std::vector<std::shared_ptr<ListenState>> listens_;
  std::set<std::shared_ptr<UcxConn>> releasing_;  // endpoint close in flight

  std::thread thread_;
  // Set by the progress thread as it starts, read by any thread
  // (OnProgressThread): until then no thread is the progress thread.
  std::atomic<std::thread::id> thread_id_{};
};

}  // namespace tern::ucx
