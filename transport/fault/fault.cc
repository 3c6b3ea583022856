// The fault-injecting decorator. Faults are applied on the sending side of
// connections made or accepted through it, so one wrapped end is enough to
// make a link misbehave in both directions' observable ways. A corrupted
// chunk keeps the checksum of the bytes meant to go (a fault on the wire,
// below it); a tampered one carries the checksum of the rewritten bytes (a
// lie above it).
#include <atomic>
#include <chrono>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "tern/fault_transport.h"
#include "transport/internal.h"

namespace tern {

using transport::Complete;
using transport::Xxh3;

namespace {

struct Shared {
  explicit Shared(const FaultPolicy& p) : policy(p), rng(p.seed) {}
  const FaultPolicy policy;
  Mutex mu;
  std::mt19937_64 rng GUARDED_BY(mu);
  uint32_t connects GUARDED_BY(mu) = 0;
  uint32_t connections GUARDED_BY(mu) = 0;  // that carried traffic
  uint64_t chunk_bytes GUARDED_BY(mu) = 0;
  bool corrupted GUARDED_BY(mu) = false;
  // Chunks rewritten so far, up to policy.tamper_chunks.
  uint32_t tampered GUARDED_BY(mu) = 0;
  FaultStats stats GUARDED_BY(mu);
  // Made connections whose Close was ignored while silenced: kept open
  // (their peers see silence) until the transport goes.
  std::vector<std::shared_ptr<Connection>> held_open GUARDED_BY(mu);
};

// One byte of a chunk to change, and how.
struct Flip {
  uint64_t at = UINT64_MAX;  // offset in the chunk; UINT64_MAX: none
  uint8_t mask = 0;
  bool any() const { return at != UINT64_MAX; }
};

// What happens to the next chunk of `length` bytes: a corrupting flip
// (below the checksum) and a tampering one (above it).
std::pair<Flip, Flip> ChooseFlipsLocked(Shared& shared, uint64_t length) REQUIRES(shared.mu) {
  const FaultPolicy& p = shared.policy;
  const uint64_t start = shared.chunk_bytes;
  shared.chunk_bytes += length;
  auto mask = [&shared]() REQUIRES(shared.mu) {
    return static_cast<uint8_t>(1u << (shared.rng() % 8));
  };
  Flip corrupt, tamper;
  if (!shared.corrupted && p.corrupt_at_byte >= start && p.corrupt_at_byte - start < length) {
    shared.corrupted = true;
    ++shared.stats.corrupted;
    corrupt = Flip{p.corrupt_at_byte - start, mask()};
  }
  const bool first =
      shared.tampered == 0 && p.tamper_at_byte >= start && p.tamper_at_byte - start < length;
  const bool more = shared.tampered > 0 && shared.tampered < p.tamper_chunks && length > 0;
  if (first || more) {
    ++shared.tampered;
    ++shared.stats.tampered;
    tamper = Flip{first ? p.tamper_at_byte - start : shared.rng() % length, mask()};
  }
  return {corrupt, tamper};
}

struct ConnState {
  std::atomic<bool> dropped{false};
  // Whether this connection is one of the first drop_connections to carry
  // traffic, decided at its first counted byte; drop_after is 0 (never)
  // until then and for the others.
  std::atomic<bool> armed{false};
  std::atomic<uint64_t> drop_after{0};
  std::atomic<uint64_t> bytes{0};  // sent and received
  Mutex mu;
  std::weak_ptr<Connection> inner GUARDED_BY(mu);
  // Set before the connection is shared with other threads, then read-only.
  std::shared_ptr<Shared> shared;
  bool made = false;  // by Connect (FaultPolicy::silence_made_connections)
  // Receive windows posted and not cancelled: a Close ignored while
  // silenced cancels them, since the caller frees their memory as if the
  // connection had closed.
  std::set<uint64_t> windows GUARDED_BY(mu);
};

bool Silenced(const ConnState& state) {
  return state.made && state.shared->policy.silence_made_connections &&
         state.shared->policy.silence_made_connections();
}

// Only connections that carry traffic use up a scheduled drop: a connect
// that failed, or succeeded too late and was closed unused (ConnectWait's
// timeout), must not, or how many drops a transfer sees would depend on
// timing.
void Arm(ConnState& state) {
  MutexLock lock(state.shared->mu);
  if (state.armed) return;
  if (state.shared->connections++ < state.shared->policy.drop_connections) {
    state.drop_after = state.shared->policy.drop_after_bytes;
  }
  state.armed = true;
}

// Counts bytes against the drop budget; false once the connection is dropped.
bool Count(ConnState& state, uint64_t bytes) {
  if (state.dropped) return false;
  if (!state.armed) Arm(state);
  const uint64_t total = state.bytes.fetch_add(bytes) + bytes;
  const uint64_t drop_after = state.drop_after.load();
  if (drop_after == 0 || total <= drop_after) return true;
  if (!state.dropped.exchange(true)) {
    {
      MutexLock lock(state.shared->mu);
      ++state.shared->stats.dropped;
    }
    std::shared_ptr<Connection> inner;
    {
      MutexLock lock(state.mu);
      inner = state.inner.lock();
    }
    if (inner) inner->Close();
  }
  return false;
}

Status Dropped() { return TERN_ERROR(kUnavailable, "fault: connection dropped in flight"); }

class FaultConnection final : public Connection {
 public:
  FaultConnection(std::shared_ptr<Connection> inner, std::shared_ptr<Shared> shared,
                  std::shared_ptr<ConnState> state, Transport& inner_transport)
      : inner_(std::move(inner)), shared_(std::move(shared)), state_(std::move(state)),
        inner_transport_(inner_transport) {}

  std::string peer_address() const override { return inner_->peer_address(); }
  uint32_t capabilities() const override { return inner_->capabilities(); }
  std::string Describe() const override { return "fault(" + inner_->Describe() + ")"; }
  uint64_t chunk_bytes_received() const override { return inner_->chunk_bytes_received(); }

  void SendMessage(std::string payload, Completion done) override {
    if (Silenced(*state_)) return Complete(done, Status::Ok());
    if (!Admit(payload.size())) return Complete(done, Dropped());
    if (!shared_->policy.rewrite_message)
      return inner_->SendMessage(std::move(payload), Wrap(std::move(done)));
    std::vector<std::string> out = shared_->policy.rewrite_message(std::move(payload));
    if (out.empty()) return Complete(done, Status::Ok());
    for (size_t i = 0; i + 1 < out.size(); ++i)
      inner_->SendMessage(std::move(out[i]), [](Status) {});
    inner_->SendMessage(std::move(out.back()), Wrap(std::move(done)));
  }

  void SendChunk(const ChunkSend& chunk, Completion done) override {
    if (Silenced(*state_)) return Complete(done, Status::Ok());
    if (!Admit(chunk.length)) return Complete(done, Dropped());
    Flip corrupt, tamper;
    {
      MutexLock lock(shared_->mu);
      std::tie(corrupt, tamper) = ChooseFlipsLocked(*shared_, chunk.length);
    }
    if ((!corrupt.any() && !tamper.any()) || chunk.src.base == nullptr ||
        chunk.src_offset > chunk.src.size_bytes ||
        chunk.length > chunk.src.size_bytes - chunk.src_offset) {
      return inner_->SendChunk(chunk, Wrap(std::move(done)));
    }
    // Change a private copy: the sender's bytes stay as they were.
    const uint8_t* src = static_cast<const uint8_t*>(chunk.src.base) + chunk.src_offset;
    auto copy = std::make_shared<std::vector<uint8_t>>(src, src + chunk.length);
    std::optional<uint64_t> xxh3 = chunk.xxh3;
    if (tamper.any()) {
      // The liar sends the checksum of its lie: the receiving transport
      // finds nothing wrong.
      (*copy)[tamper.at] ^= tamper.mask;
      xxh3 = Xxh3(copy->data(), copy->size());
    }
    if (corrupt.any()) {
      // The checksum of the bytes meant to go: the receiver must notice.
      if (!xxh3) xxh3 = Xxh3(copy->data(), copy->size());
      (*copy)[corrupt.at] ^= corrupt.mask;
    }
    auto region = inner_transport_.RegisterMemory(copy->data(), copy->size(), MemoryKind::kHost);
    if (!region.ok()) return Complete(done, region.status());
    ChunkSend changed = chunk;
    changed.src = *region;
    changed.src_offset = 0;
    changed.xxh3 = xxh3;
    Transport* t = &inner_transport_;
    MemoryRegion r = *region;
    inner_->SendChunk(changed, Wrap([copy, t, r, done = std::move(done)](Status st) {
                        t->DeregisterMemory(r).IgnoreError();
                        Complete(done, std::move(st));
                      }));
  }

  Status PostReceive(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
                     uint64_t length_bytes, ChunkLanded on_landed) override {
    {
      MutexLock lock(state_->mu);
      state_->windows.insert(transfer_id);
    }
    return inner_->PostReceive(transfer_id, dst, dst_offset, length_bytes,
                               [state = state_, on_landed = std::move(on_landed)](uint64_t off, uint64_t len) {
                                 if (Count(*state, len) && on_landed) on_landed(off, len);
                               });
  }
  void CancelReceive(uint64_t transfer_id) override {
    {
      MutexLock lock(state_->mu);
      state_->windows.erase(transfer_id);
    }
    inner_->CancelReceive(transfer_id);
  }
  Result<std::string> ExportRegion(const MemoryRegion& region) override {
    return inner_->ExportRegion(region);
  }
  void Write(const MemoryRegion& src, uint64_t src_offset, std::string_view key, uint64_t dst_offset,
             uint64_t length, Completion done) override {
    if (!Admit(length)) return Complete(done, Dropped());
    inner_->Write(src, src_offset, key, dst_offset, length, Wrap(std::move(done)));
  }
  void Close() override {
    if (Silenced(*state_)) {
      std::set<uint64_t> windows;
      {
        MutexLock lock(state_->mu);
        windows.swap(state_->windows);
      }
      for (uint64_t id : windows) inner_->CancelReceive(id);
      MutexLock lock(shared_->mu);
      shared_->held_open.push_back(inner_);
      return;
    }
    inner_->Close();
  }

 private:
  // Applies delay and the drop budget; false when the connection is dropped.
  bool Admit(uint64_t bytes) {
    if (shared_->policy.delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(shared_->policy.delay_us));
    }
    return Count(*state_, bytes);
  }

  Completion Wrap(Completion done) {
    return [state = state_, done = std::move(done)](Status st) {
      if (!st.ok() && state->dropped) st = Dropped();
      Complete(done, std::move(st));
    };
  }

  std::shared_ptr<Connection> inner_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<ConnState> state_;
  Transport& inner_transport_;
};

class FaultTransportImpl final : public FaultTransport {
 public:
  FaultTransportImpl(Transport& inner, FaultPolicy policy)
      : inner_(inner), shared_(std::make_shared<Shared>(policy)) {}
  ~FaultTransportImpl() override {
    std::vector<std::shared_ptr<Connection>> held;
    {
      MutexLock lock(shared_->mu);
      held.swap(shared_->held_open);
    }
    for (auto& c : held) c->Close();
  }

  std::string name() const override { return "fault(" + inner_.name() + ")"; }
  uint32_t capabilities() const override { return inner_.capabilities(); }
  FaultStats stats() const override {
    MutexLock lock(shared_->mu);
    return shared_->stats;
  }

  Result<MemoryRegion> RegisterMemory(void* base, uint64_t size_bytes, MemoryKind kind) override {
    return inner_.RegisterMemory(base, size_bytes, kind);
  }
  Status DeregisterMemory(const MemoryRegion& region) override {
    return inner_.DeregisterMemory(region);
  }

  Result<std::unique_ptr<Listener>> Listen(const std::string& address, AcceptHandler on_accept) override {
    auto shared = shared_;
    Transport* inner = &inner_;
    return inner_.Listen(address, [shared, inner, on_accept](std::shared_ptr<Connection> c) {
      auto state = NewState(shared);
      {
        MutexLock lock(state->mu);
        state->inner = c;
      }
      auto fc = std::make_shared<FaultConnection>(std::move(c), shared, state, *inner);
      return WrapHandlers(on_accept(fc), state);
    });
  }

  void Connect(const std::string& address, ConnectionHandlers handlers, ConnectDone done) override {
    {
      MutexLock lock(shared_->mu);
      if (shared_->connects++ < shared_->policy.refuse_connects) {
        ++shared_->stats.refused;
        done(Status(shared_->policy.refuse_code, "fault: connection to " + address + " refused"));
        return;
      }
    }
    auto state = NewState(shared_);
    state->made = true;
    auto shared = shared_;
    Transport* inner = &inner_;
    inner_.Connect(address, WrapHandlers(std::move(handlers), state),
                   [shared, state, inner, done = std::move(done)](Result<std::shared_ptr<Connection>> r) {
                     if (!r.ok()) return done(std::move(r).take_status());
                     {
                       MutexLock lock(state->mu);
                       state->inner = *r;
                     }
                     done(std::shared_ptr<Connection>(
                         std::make_shared<FaultConnection>(*r, shared, state, *inner)));
                   });
  }

 private:
  static std::shared_ptr<ConnState> NewState(const std::shared_ptr<Shared>& shared) {
    auto state = std::make_shared<ConnState>();
    state->shared = shared;
    return state;
  }

  static ConnectionHandlers WrapHandlers(ConnectionHandlers h, std::shared_ptr<ConnState> state) {
    ConnectionHandlers out;
    out.on_message = [state, on_message = std::move(h.on_message)](std::string m) {
      if (Silenced(*state)) return;
      if (Count(*state, m.size()) && on_message) on_message(std::move(m));
    };
    out.on_closed = [state, on_closed = std::move(h.on_closed)](Status why) {
      if (state->dropped) why = Dropped();
      if (on_closed) on_closed(std::move(why));
    };
    return out;
  }

  Transport& inner_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace

std::unique_ptr<FaultTransport> NewFaultTransport(Transport& inner, FaultPolicy policy) {
  return std::make_unique<FaultTransportImpl>(inner, policy);
}

}  // namespace tern
