// The in-process loopback backend. Each connection end has an inbox and one
// delivery thread, so callbacks never run on the caller's stack (no
// re-entrancy) and are serialized per connection end, as on a real wire.
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "base/mutex.h"
#include "tern/loopback_transport.h"
#include "transport/internal.h"
#include "transport/window_table.h"

namespace tern {

using transport::AcceptGate;
using transport::Complete;
using transport::Landing;
using transport::LandingWait;
using transport::ThreadTracker;
using transport::WindowTable;
using transport::Xxh3;

namespace {

constexpr size_t kMaxInbox = 4096;

class LoopTransport;

struct Item {
  enum Kind { kMessage, kChunk, kAck, kPeerClosed, kShutdown };
  explicit Item(Kind k) : kind(k) {}
  Kind kind;
  std::string payload;
  ChunkSend chunk;
  uint64_t xxh3 = 0;
  uint64_t op = 0;
  Status status;
};

class Endpoint final : public Connection, public std::enable_shared_from_this<Endpoint> {
 public:
  explicit Endpoint(std::string peer_name) : peer_name_(std::move(peer_name)) {}

  std::string peer_address() const override { return peer_name_; }
  uint64_t chunk_bytes_received() const override {
    return chunk_bytes_received_.load(std::memory_order_relaxed);
  }
  uint32_t capabilities() const override { return kCapChunkChecksum; }
  std::string Describe() const override { return "loopback"; }

  void SendMessage(std::string payload, Completion done) override EXCLUDES(mu_) {
    if (payload.size() > kMaxMessageBytes) {
      return Complete(done, TERN_ERROR(kOutOfRange, "message of ", payload.size(), " bytes exceeds ",
                                       kMaxMessageBytes));
    }
    Item item(Item::kMessage);
    item.payload = std::move(payload);
    Complete(done, PushToPeer(std::move(item)));
  }

  void SendChunk(const ChunkSend& chunk, Completion done) override EXCLUDES(mu_) {
    if (chunk.length == 0 || chunk.length > kMaxChunkBytes || chunk.src.base == nullptr ||
        chunk.src.handle == 0 || chunk.src_offset > chunk.src.size_bytes ||
        chunk.length > chunk.src.size_bytes - chunk.src_offset) {
      return Complete(done, TERN_ERROR(kInvalidArgument, "chunk outside its registered source"));
    }
    Item item(Item::kChunk);
    item.chunk = chunk;
    item.xxh3 = chunk.xxh3 ? *chunk.xxh3
                           : Xxh3(static_cast<const uint8_t*>(chunk.src.base) + chunk.src_offset,
                                  chunk.length);
    {
      MutexLock lock(mu_);
      if (closed_) return Complete(done, TERN_ERROR(kUnavailable, "connection closed"));
      item.op = next_op_++;
      pending_[item.op] = std::move(done);
    }
    Status st = PushToPeer(std::move(item));
    if (!st.ok()) FinishOp(item.op, st);
  }

  Status PostReceive(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
                     uint64_t length_bytes, ChunkLanded on_landed) override {
    return windows_.Post(transfer_id, dst, dst_offset, length_bytes, std::move(on_landed));
  }

  // Landings run on this end's delivery thread, which must not wait for
  // itself.
  void CancelReceive(uint64_t transfer_id) override { windows_.Cancel(transfer_id, OffDelivery()); }

  void Close() override EXCLUDES(mu_) {
    std::shared_ptr<Endpoint> peer;
    {
      MutexLock lock(mu_);
      if (closed_) return;
      closed_ = true;
      inbox_.push_back(Item(Item::kShutdown));
      peer = peer_.lock();
      cv_.SignalAll();
    }
    {
      // A peer may be copying out of one of our chunks (BeginCopy succeeded
      // before closed_ was set): Close() promises the sources are ours
      // again when it returns, so wait for those copies. No new one starts:
      // BeginCopy refuses once closed_ is set.
      MutexLock lock(mu_);
      cv_.Wait([&]() REQUIRES(mu_) { return active_copies_ == 0; });
    }
    // A copy into one of our windows may be under way; Close() promises
    // the memory is ours again when it returns.
    windows_.Close();
    windows_.WaitIdle(OffDelivery());
    if (peer) peer->Push(Item(Item::kPeerClosed), /*force=*/true).IgnoreError();
  }

  // Before the delivery thread starts (Run) and before any send.
  void Bind(std::weak_ptr<Endpoint> peer, ConnectionHandlers handlers) EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      peer_ = std::move(peer);
    }
    handlers_ = std::move(handlers);
  }

  // The delivery loop; runs on this end's thread until shutdown.
  void Run() EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      thread_id_ = std::this_thread::get_id();
    }
    for (;;) {
      Item item(Item::kShutdown);
      {
        MutexLock lock(mu_);
        cv_.Wait([&]() REQUIRES(mu_) { return !inbox_.empty(); });
        item = std::move(inbox_.front());
        inbox_.pop_front();
        cv_.SignalAll();
      }
      switch (item.kind) {
        case Item::kMessage:
          if (handlers_.on_message && !IsClosed()) handlers_.on_message(std::move(item.payload));
          break;
        case Item::kChunk:
          Land(item);
          break;
        case Item::kAck:
          FinishOp(item.op, std::move(item.status));
          break;
        case Item::kPeerClosed:
        case Item::kShutdown: {
          const bool by_peer = item.kind == Item::kPeerClosed;
          std::map<uint64_t, Completion> pending;
          {
            MutexLock lock(mu_);
            closed_ = true;
            pending.swap(pending_);
            inbox_.clear();
            // The peer may be copying out of our memory for an op we are
            // about to fail; the caller may free it once the op completes.
            cv_.Wait([&]() REQUIRES(mu_) { return active_copies_ == 0; });
          }
          windows_.Close();
          if (by_peer) {
            if (auto peer = Peer()) peer->Push(Item(Item::kPeerClosed), true).IgnoreError();
          }
          for (auto& [op, done] : pending) {
            Complete(done, by_peer ? TERN_ERROR(kUnavailable, "peer closed the connection")
                                   : TERN_ERROR(kCancelled, "connection closed"));
          }
          if (handlers_.on_closed) handlers_.on_closed(Status::Ok());
          handlers_ = {};
          {
            // Other threads read peer_ (PushToPeer from SendMessage).
            MutexLock lock(mu_);
            peer_.reset();
          }
          return;
        }
      }
    }
  }

  // The receiver brackets every copy out of our memory with these; false
  // when the op already completed (its memory may be gone).
  bool BeginCopy(uint64_t op) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (closed_ || !pending_.count(op)) return false;
    ++active_copies_;
    return true;
  }
  void EndCopy() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    --active_copies_;
    cv_.SignalAll();
  }

  Status Push(Item item, bool force = false) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (closed_ && !force) return TERN_ERROR(kUnavailable, "connection closed");
    if (closed_ && item.kind == Item::kPeerClosed) return Status::Ok();  // already shutting down
    TERN_REQUIRE(force || inbox_.size() < kMaxInbox, kResourceExhausted, "peer inbox full (",
                 kMaxInbox, " frames)");
    inbox_.push_back(std::move(item));
    cv_.SignalAll();
    return Status::Ok();
  }

 private:
  std::atomic<uint64_t> chunk_bytes_received_{0};
  LandingWait OffDelivery() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return LandingWait{std::this_thread::get_id() != thread_id_, 0};
  }

  bool IsClosed() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return closed_;
  }

  std::shared_ptr<Endpoint> Peer() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return peer_.lock();
  }

  Status PushToPeer(Item item) EXCLUDES(mu_) {
    auto peer = Peer();
    if (!peer || IsClosed()) return TERN_ERROR(kUnavailable, "connection closed");
    return peer->Push(std::move(item));
  }

  void FinishOp(uint64_t op, Status status) EXCLUDES(mu_) {
    Completion done;
    {
      MutexLock lock(mu_);
      auto it = pending_.find(op);
      if (it == pending_.end()) return;
      done = std::move(it->second);
      pending_.erase(it);
    }
    Complete(done, std::move(status));
  }

  // Places a chunk from the peer into our window and acknowledges it.
  void Land(const Item& item) EXCLUDES(mu_) {
    const ChunkSend& c = item.chunk;
    std::shared_ptr<Endpoint> sender = Peer();
    if (!sender || !sender->BeginCopy(item.op)) return;  // the sender gave up on it
    Result<Landing> landing = windows_.Begin(c.transfer_id, c.dst_offset, c.length);
    Status result = landing.status();
    if (landing.ok()) {
      std::memcpy(landing->dst, static_cast<const uint8_t*>(c.src.base) + c.src_offset, c.length);
      chunk_bytes_received_.fetch_add(c.length, std::memory_order_relaxed);  // one copy: whole
      sender->EndCopy();
      result = windows_.Finish(*landing, Status::Ok(), item.xxh3);
    } else {
      sender->EndCopy();
    }
    Item ack(Item::kAck);
    ack.op = item.op;
    ack.status = std::move(result);
    PushToPeer(std::move(ack)).IgnoreError();  // a closed sender fails its op itself
  }

  const std::string peer_name_;
  Mutex mu_;
  CondVar cv_{&mu_};  // inbox_ grew or shrank, a copy ended
  std::deque<Item> inbox_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
  // Read by every thread that sends (PushToPeer) and reset by the delivery
  // thread at shutdown: read through Peer().
  std::weak_ptr<Endpoint> peer_ GUARDED_BY(mu_);
  ConnectionHandlers handlers_;  // the delivery thread's only, after Bind
  WindowTable windows_{"loopback"};
  std::map<uint64_t, Completion> pending_ GUARDED_BY(mu_);
  uint64_t next_op_ GUARDED_BY(mu_) = 1;
  uint32_t active_copies_ GUARDED_BY(mu_) = 0;  // peers copying out of our chunks now
  std::thread::id thread_id_ GUARDED_BY(mu_);
};

}  // namespace

struct LoopbackNetwork::Impl {
  struct Entry {
    LoopTransport* owner;
    std::shared_ptr<AcceptGate> gate;
  };
  Mutex mu;
  std::map<std::string, Entry> listeners GUARDED_BY(mu);
};

LoopbackNetwork::LoopbackNetwork() : impl_(std::make_unique<Impl>()) {}
LoopbackNetwork::~LoopbackNetwork() = default;

namespace {

class LoopTransport final : public Transport {
 public:
  explicit LoopTransport(LoopbackNetwork::Impl* net) : net_(net) {}
  ~LoopTransport() override {
    std::vector<std::shared_ptr<AcceptGate>> gates;  // of listeners left open (a caller's bug)
    {
      MutexLock lock(net_->mu);
      for (auto it = net_->listeners.begin(); it != net_->listeners.end();) {
        if (it->second.owner == this) {
          gates.push_back(it->second.gate);
          it = net_->listeners.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& g : gates) g->Close();  // no Connect is starting an end on us after this
    std::vector<std::weak_ptr<Endpoint>> ends;
    {
      MutexLock lock(mu_);
      ends.swap(ends_);
    }
    for (auto& weak : ends) {
      if (auto e = weak.lock()) e->Close();
    }
    threads_.WaitAll();
  }

  std::string name() const override { return "loopback"; }
  uint32_t capabilities() const override { return kCapChunkChecksum; }

  Result<MemoryRegion> RegisterMemory(void* base, uint64_t size_bytes, MemoryKind kind) override {
    TERN_REQUIRE(kind == MemoryKind::kHost, kUnsupported, "loopback registers host memory only");
    TERN_REQUIRE(base != nullptr || size_bytes == 0, kInvalidArgument, "null memory");
    return MemoryRegion{base, size_bytes, kind, next_handle_.fetch_add(1)};
  }
  Status DeregisterMemory(const MemoryRegion&) override { return Status::Ok(); }

  Result<std::unique_ptr<Listener>> Listen(const std::string& address, AcceptHandler on_accept) override;
  void Connect(const std::string& address, ConnectionHandlers handlers, ConnectDone done) override;

  void Start(const std::shared_ptr<Endpoint>& end) {
    {
      MutexLock lock(mu_);
      ends_.erase(std::remove_if(ends_.begin(), ends_.end(), [](auto& w) { return w.expired(); }),
                  ends_.end());
      ends_.push_back(end);
    }
    threads_.Spawn([end] { end->Run(); });
  }

  LoopbackNetwork::Impl* net() { return net_; }

 private:
  LoopbackNetwork::Impl* net_;
  std::atomic<uint64_t> next_handle_{1};
  Mutex mu_;
  std::vector<std::weak_ptr<Endpoint>> ends_ GUARDED_BY(mu_);
  std::atomic<uint64_t> next_client_{1};
  ThreadTracker threads_;  // last: waited for in the destructor body
};

class LoopListener final : public Listener {
 public:
  LoopListener(LoopbackNetwork::Impl* net, std::string name, std::shared_ptr<AcceptGate> gate)
      : net_(net), name_(std::move(name)), gate_(std::move(gate)) {}
  ~LoopListener() override { Close(); }
  std::string address() const override { return name_; }
  void Close() override {
    {
      MutexLock lock(net_->mu);
      auto it = net_->listeners.find(name_);
      if (it != net_->listeners.end() && it->second.gate == gate_) net_->listeners.erase(it);
    }
    gate_->Close();  // a Connect that found us may be in the handler
  }

 private:
  LoopbackNetwork::Impl* net_;
  std::string name_;
  std::shared_ptr<AcceptGate> gate_;
};

Result<std::unique_ptr<Listener>> LoopTransport::Listen(const std::string& address,
                                                        AcceptHandler on_accept) {
  TERN_REQUIRE(!address.empty(), kInvalidArgument, "empty loopback address");
  MutexLock lock(net_->mu);
  TERN_REQUIRE(!net_->listeners.count(address), kAlreadyExists, "loopback address '", address,
               "' in use");
  auto gate = std::make_shared<AcceptGate>(std::move(on_accept));
  net_->listeners[address] = {this, gate};
  return std::unique_ptr<Listener>(std::make_unique<LoopListener>(net_, address, gate));
}

void LoopTransport::Connect(const std::string& address, ConnectionHandlers handlers,
                            ConnectDone done) {
  LoopbackNetwork::Impl::Entry entry{};
  {
    MutexLock lock(net_->mu);
    auto it = net_->listeners.find(address);
    if (it != net_->listeners.end()) entry = it->second;
  }
  if (!entry.owner) {
    done(TERN_ERROR(kUnavailable, "no loopback listener named '", address, "'"));
    return;
  }
  auto client = std::make_shared<Endpoint>(address);
  auto server = std::make_shared<Endpoint>("loop-client-" + std::to_string(next_client_++));
  // The server end starts inside the gate: once the listener's Close()
  // returned, its transport may be destroyed.
  const bool accepted = entry.gate->Call(server, [&](ConnectionHandlers server_handlers) {
    server->Bind(client, std::move(server_handlers));
    client->Bind(server, std::move(handlers));
    entry.owner->Start(server);
  });
  if (!accepted) {  // the listener closed meanwhile
    done(TERN_ERROR(kUnavailable, "loopback listener '", address, "' closed"));
    return;
  }
  done(std::shared_ptr<Connection>(client));
  Start(client);
}

}  // namespace

std::unique_ptr<Transport> NewLoopbackTransport(LoopbackNetwork& network) {
  return std::make_unique<LoopTransport>(network.impl());
}

}  // namespace tern
