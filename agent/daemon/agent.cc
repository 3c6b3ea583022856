// The agent's common half: start and stop, the one listener shared by the
// control and data planes, the work and ticker threads (agent/daemon/agent_impl.h).
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "agent/daemon/agent_impl.h"
#include "agent/daemon/serve_hook.h"
#include "agent/daemon/engine_driver.h"
#include "agent/engine/engine_adapter.h"
#include "agent/engine/sglang_adapter.h"
#include "agent/daemon/publish_jobs.h"
#include "agent/daemon/rank_part_jobs.h"
#include "agent/ops/admin_http.h"
#include "agent/ops/metrics.h"
#include "base/log.h"

namespace tern {

Result<std::unique_ptr<Agent>> Agent::Start(const AgentOptions& options) {
  auto agent = std::make_unique<agent::AgentImpl>(options);
  Status s = agent->Init();
  if (!s.ok()) {
    agent->Stop();
    return s;
  }
  return std::unique_ptr<Agent>(std::move(agent));
}

namespace agent {
namespace {

// Work items queued at once; past it the agent is hopelessly behind and
// drops the oldest heartbeat-driven work rather than grow without bound.
constexpr size_t kMaxQueuedWork = 4096;

}  // namespace

AgentImpl::AgentImpl(const AgentOptions& options)
    : opt_(options),
      env_(options.env ? *options.env : DefaultEnv()),
      clock_(env_.clock()),
      log_(options.log ? options.log : StderrLog()),
      pool_(options.threads),
      events_(std::make_unique<EventRing>(clock_)) {
  mu_.Watch(&lock_watch_);
}

void AgentImpl::LogSlowLockHolds() {
  auto log = [this](const char* whose, const LockWatch& watch, uint64_t* logged) {
    for (const LockWatch::Hold& h : watch.Since(*logged)) {
      char held[128];
      std::snprintf(held, sizeof held,
                    "%.3f s (%.3f s of it on a CPU; blocked %llu, preempted %llu times)",
                    h.held_us / 1e6, h.cpu_us / 1e6, static_cast<unsigned long long>(h.blocked),
                    static_cast<unsigned long long>(h.preempted));
      std::string line = std::string(whose) + " lock was held " + held + " at " + h.site +
                         " (every thread that needed it waited)";
      if (h.seq > *logged + 1)
        line += "; " + std::to_string(h.seq - *logged - 1) + " earlier slow holds not kept";
      Log(line);
      *logged = h.seq;
    }
  };
  log("the agent's", lock_watch_, &lock_logged_seq_);
  // A member makes its relay when it first joins (under mu_); Stop resets it
  // after this thread has ended.
  const RelayNode* relay = RelayNow();
  if (relay) log("the relay's", relay->lock_watch(), &relay_lock_logged_seq_);
}

AgentImpl::~AgentImpl() { Stop(); }

void AgentImpl::Log(const std::string& line) const {
  const std::shared_ptr<const std::string> name = log_name_.load();
  log_("agent " + (name ? *name : std::string()) + ": " + line);
}

void AgentImpl::Flush(Outbox& out) {
  for (auto& o : out) {
    if (!o.conn) continue;
    std::weak_ptr<Connection> weak = o.conn;
    o.conn->SendMessage(std::move(o.payload), [weak](Status s) {
      // A failed send shows up as the connection closing; nothing to do here.
      (void)weak;
      s.IgnoreError();
    });
  }
  out.clear();
}

void AgentImpl::Send(Outbox& out, const std::shared_ptr<Connection>& conn, const ControlMessage& m) {
  auto bytes = EncodeControl(m);
  if (!bytes.ok()) {
    Log(std::string("not sending ") + ControlTypeName(TypeOf(m)) + ": " + bytes.status().ToString());
    return;
  }
  out.push_back({conn, std::move(bytes).value()});
}

Status AgentImpl::Init() {
  TERN_REQUIRE(opt_.transport != nullptr, kInvalidArgument, "agent: no transport");
  TERN_REQUIRE(!opt_.data_dir.empty(), kInvalidArgument, "agent: --data DIR is required");
  TERN_REQUIRE(!opt_.listen.empty(), kInvalidArgument, "agent: --listen HOST:PORT is required");
  TERN_REQUIRE(!opt_.intra_transport || !opt_.listen_intra.empty(), kInvalidArgument,
               "agent: an intra-cluster transport needs --listen-intra HOST:PORT");
  TERN_REQUIRE(!opt_.intra_transport || opt_.intra_transport != opt_.transport, kInvalidArgument,
               "agent: the intra-cluster transport must be another instance than the main one");
  TERN_REQUIRE(opt_.root || !opt_.join.empty(), kInvalidArgument,
               "agent: a member needs --join HOST:PORT (or --root)");
  TERN_REQUIRE(opt_.heartbeat_ms > 0 && opt_.dead_after_ms > opt_.heartbeat_ms, kInvalidArgument,
               "agent: dead_after_ms must exceed heartbeat_ms > 0");
  TERN_REQUIRE(opt_.patch_format <= 2, kInvalidArgument, "agent: patch format ", opt_.patch_format,
               " (want 1 or 2)");
  TERN_RETURN_IF_ERROR(CheckFreshnessOptions());
  TERN_RETURN_IF_ERROR(CreateDirs(env_, opt_.data_dir));
  objects_dir_ = opt_.data_dir + "/objects";
  published_dir_ = opt_.data_dir + "/published";
  TERN_RETURN_IF_ERROR(CreateDirs(env_, objects_dir_));
  // Keys expire by the same wall clock the beacons are judged by.
  verifier_.SetWallClock([this] { return WallUnixMs(); });
  for (const auto& pem : opt_.trusted_keys_pem) TERN_RETURN_IF_ERROR(verifier_.AddTrustedKeyPem(pem));
  TERN_REQUIRE(opt_.key_sets.empty() || opt_.root, kInvalidArgument,
               "agent: key sets are given to the root (members learn them from it)");
  TERN_REQUIRE(opt_.key_sets.size() <= kMaxControlKeySets, kInvalidArgument, "agent: ",
               opt_.key_sets.size(), " key sets (at most ", kMaxControlKeySets, ")");
  TERN_REQUIRE(
      !opt_.relay_only || (!opt_.root && opt_.may_relay && opt_.seed_checkpoint.empty()),
      kInvalidArgument,
      "agent: --relay-only is for members that relay (not with --root, --no-relay or --seed)");
  if (opt_.relay_only) {
    // It keeps no view: a DIR that serves one belongs to a serving member,
    // whose engines would go on reading a version nobody advances.
    TERN_ASSIGN_OR_RETURN(FileType current, env_.TypeOf(opt_.data_dir + "/current", false));
    TERN_REQUIRE(current == FileType::kMissing, kInvalidArgument, "agent: ", opt_.data_dir,
                 "/current exists: that DIR serves a view; a relay-only member keeps none (give it "
                 "another --data DIR)");
  } else {
    // The root diffs each new version against its view and its board's HEAD
    // is durable: a view that a power loss could lower a version (the
    // deferred sync, docs/agent/apply.md) would not match HEAD, so the root
    // keeps the fully synced switch. Members defer the sync.
    ViewStoreOptions store_options;
    store_options.sync_at_switch = opt_.root;
    TERN_ASSIGN_OR_RETURN(store_,
                          ViewStore::Open(env_, opt_.data_dir, pool_, log_, store_options));
    MutexLock lock(mu_);
    NoteServedLocked();
  }
  TERN_REQUIRE(opt_.seed_checkpoint.empty() || (!opt_.root && opt_.seed_version > 0), kInvalidArgument,
               "agent: --seed is for members, with --seed-version N > 0");
  {
    MutexLock lock(mu_);
    seed_pending_ = !opt_.seed_checkpoint.empty() && store_version_ < opt_.seed_version;
  }
  metrics_ = std::make_unique<MetricsRegistry>();
  TERN_RETURN_IF_ERROR(InitEngine());

  // A standby root waits here, before it listens, until it leads.
  if (opt_.root && !opt_.board_etcd.empty()) TERN_RETURN_IF_ERROR(CampaignForRoot());
  TERN_RETURN_IF_ERROR(StartListener());
  id_ = opt_.id.empty() ? listen_address_ : opt_.id;
  log_name_.store(std::make_shared<const std::string>(id_));
  TERN_RETURN_IF_ERROR(opt_.root ? InitRoot() : InitMember());
  TERN_RETURN_IF_ERROR(StartAdmin());
  {
    MutexLock lock(mu_);
    started_ = true;
  }
  if (!opt_.on_serve_command.empty()) {
    serve_hook_ = std::make_unique<ServeHook>(*events_, opt_.on_serve_command,
                                              opt_.on_serve_timeout_ms,
                                              [this](std::string_view line) { Log(std::string(line)); });
    serve_hook_->Start();
  }
  work_thread_ = std::thread([this] { WorkLoop(); });
  tick_thread_ = std::thread([this] { TickLoop(); });
  Log(std::string(opt_.root         ? "root"
                  : opt_.relay_only ? "relay-only member"
                                    : "member") +
      " listening on " + listen_address_ +
      (intra_address_.empty() ? ""
                              : " and, inside cluster '" + opt_.cluster + "', on " +
                                    intra_address_ + " (" + opt_.intra_transport->name() + ")") +
      (admin_address_.empty() ? ""
       : ", admin on " + (admin_address_.rfind("https://", 0) == 0 ? "" : std::string("http://")) +
             admin_address_) +
      (store_ ? ", serving version " + std::to_string(store_->version()) : ", serving nothing"));
  return Status::Ok();
}

// One port for both planes: the first message of a connection says which
// one it speaks (control types 0x01-0x3F, data 0x40-0x7F); anything else is
// refused and the connection closed.
ConnectionHandlers AgentImpl::Accept(std::shared_ptr<Connection> conn, Transport* via) {
  // Shared by the connection's handlers. Under mu: the agent's mu_ (the
  // relay lookup) and the relay's ChildAcceptor; mu is let go before the
  // relay's handlers, the root's control work or Close run (they may end in
  // on_closed, which takes it).
  struct State {
    explicit State(std::shared_ptr<Connection> conn) : hold(std::move(conn)) {}
    Mutex mu;
    // kProbe: a connection that opened with PING (a member measuring its
    // round trip to this agent as its parent); it gets PONGs, nothing else.
    enum { kUnknown, kControl, kData, kProbe, kRefused } mode GUARDED_BY(mu) = kUnknown;
    ConnectionHandlers data GUARDED_BY(mu);  // the relay's, in data mode
    std::string member_id GUARDED_BY(mu);    // control mode, once joined
    // The caller owns accepted connections (transport.h): held here until
    // the connection closes (a decorator such as the fault transport's is
    // owned by nobody else).
    std::shared_ptr<Connection> hold GUARDED_BY(mu);
  };
  auto st = std::make_shared<State>(conn);
  std::weak_ptr<Connection> weak = conn;
  ConnectionHandlers h;
  h.on_message = [this, st, weak, via, gate = gate_](std::string payload) {
    ReaderLock open(gate->mu);
    if (!gate->open) return;
    auto conn = weak.lock();
    if (!conn) return;
    MutexLock lock(st->mu);
    if (st->mode == State::kUnknown) {
      const uint8_t type = payload.empty() ? 0 : static_cast<uint8_t>(payload[0]);
      if (type == static_cast<uint8_t>(ControlType::kPing)) {
        st->mode = State::kProbe;
      } else if (type >= 0x01 && type <= 0x3F && opt_.root && via == opt_.transport) {
        st->mode = State::kControl;
      } else if (type >= 0x40 && type <= 0x7F) {
        RelayNode* relay = RelayNow();
        if (relay) {
          st->data = relay->ChildAcceptor(via)(conn);
          st->mode = State::kData;
        } else {
          st->mode = State::kRefused;
        }
      } else {
        st->mode = State::kRefused;
      }
      if (st->mode == State::kRefused) {
        st->hold.reset();
        lock.Unlock();
        Log("refused a connection from " + conn->peer_address() + ": first message type " +
            std::to_string(type) + (opt_.root ? "" : " (a member takes no control connections)"));
        conn->Close();
        return;
      }
    }
    if (st->mode == State::kData) {
      auto on_message = st->data.on_message;
      lock.Unlock();
      if (on_message) on_message(std::move(payload));
      return;
    }
    if (st->mode == State::kProbe) {
      lock.Unlock();
      auto m = DecodeControl(payload);
      auto* ping = m.ok() ? std::get_if<Ping>(&*m) : nullptr;
      if (!ping) {
        Log("closing probe connection from " + conn->peer_address() + ": not a PING");
        conn->Close();
        return;
      }
      Outbox out;
      Send(out, conn, Pong{ping->nonce});
      Flush(out);
      return;
    }
    if (st->mode != State::kControl) return;
    auto m = DecodeControl(payload);
    if (!m.ok()) {
      const bool joining = st->member_id.empty();
      lock.Unlock();
      Log("closing control connection from " + conn->peer_address() + ": " + m.status().ToString());
      // A HELLO this root cannot read (another release's control protocol,
      // say) gets the reason in REJECT, whose layout every protocol shares,
      // so the member logs it instead of a bare closed connection.
      if (joining && !payload.empty() && payload[0] == static_cast<char>(ControlType::kHello)) {
        Outbox out;
        Send(out, conn, Reject{m.status().message()});
        Flush(out);
      }
      conn->Close();
      return;
    }
    // Control messages of one connection are serialized by the transport,
    // so member_id is this handler's to update; st->mu is not held while
    // the root works (it may close the connection, and on_closed takes it).
    std::string member_id = st->member_id;
    lock.Unlock();
    RootOnControl(conn, &member_id, std::move(m).value());
    lock.Lock();
    st->member_id = member_id;
  };
  h.on_closed = [this, st, weak, gate = gate_](Status why) {
    ReaderLock open(gate->mu);
    if (!gate->open) return;
    MutexLock lock(st->mu);
    auto held = std::move(st->hold);  // released when this handler returns
    if (st->mode == State::kData) {
      auto on_closed = st->data.on_closed;
      lock.Unlock();
      if (on_closed) on_closed(std::move(why));
      return;
    }
    if (st->mode == State::kControl && !st->member_id.empty()) {
      const std::string id = st->member_id;
      lock.Unlock();
      RootOnClosed(id, weak.lock());
    }
  };
  return h;
}

Status AgentImpl::StartListener() {
  Transport* primary = opt_.transport;
  auto listener = primary->Listen(opt_.listen, [this, primary](std::shared_ptr<Connection> conn) {
    return Accept(std::move(conn), primary);
  });
  if (!listener.ok()) return listener.status().WithContext("agent: listen on " + opt_.listen);
  listener_ = std::move(listener).value();
  listen_address_ = listener_->address();
  if (Transport* intra = opt_.intra_transport) {
    // Data and probes only: control stays on the main listener.
    auto l = intra->Listen(opt_.listen_intra, [this, intra](std::shared_ptr<Connection> conn) {
      return Accept(std::move(conn), intra);
    });
    if (!l.ok())
      return l.status().WithContext("agent: listen on " + opt_.listen_intra + " (" + intra->name() +
                                    ")");
    intra_listener_ = std::move(l).value();
    intra_address_ = intra_listener_->address();
  }
  return Status::Ok();
}

Status AgentImpl::MakeRelay(const BoardId& board, RelayCallbacks callbacks) {
  RelayOptions ro;
  ro.member_id = id_;
  ro.join_token = opt_.join_token;  // presented to parents, required of children
  ro.push_window_bytes = opt_.push_window_bytes;
  ro.window_chunks = opt_.window_chunks;
  ro.window_bytes = opt_.window_bytes;
  auto relay = std::make_unique<RelayNode>(*opt_.transport, env_, objects_dir_, verifier_, board,
                                           log_, ro, std::move(callbacks));
  if (opt_.intra_transport) TERN_RETURN_IF_ERROR(relay->AddTransport(*opt_.intra_transport));
  relay_ = std::move(relay);
  return Status::Ok();
}

void AgentImpl::Post(std::function<void()> work) {
  MutexLock lock(mu_);
  if (stopping_) return;
  if (work_.size() >= kMaxQueuedWork) {
    Log("work queue full; dropping the oldest item");
    work_.pop_front();
  }
  work_.push_back(std::move(work));
  work_cv_.Signal();
}

void AgentImpl::WorkLoop() {
  for (;;) {
    std::function<void()> item;
    {
      MutexLock lock(mu_);
      work_cv_.Wait([&]() REQUIRES(mu_) { return stopping_ || !work_.empty(); });
      if (stopping_) return;
      item = std::move(work_.front());
      work_.pop_front();
    }
    item();
  }
}

void AgentImpl::TickLoop() {
  // Twice per heartbeat: the root's (WELCOME) once a member joined, read
  // again at every step so that a new root's takes effect at once.
  const auto tick_us = [this] {
    const uint32_t board = board_heartbeat_ms_.load();
    return std::max<uint64_t>(1000, uint64_t{board ? board : opt_.heartbeat_ms} * 1000 / 2);
  };
  for (;;) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    if (opt_.root) {
      RootTick();
    } else {
      MemberTick();
    }
    LogSlowLockHolds();
    // Sleep in short steps so that Stop returns promptly.
    for (uint64_t slept = 0, tick = tick_us(); slept < tick; tick = tick_us()) {
      const uint64_t step = std::min<uint64_t>(20000, tick - slept);
      clock_.SleepUs(step);
      slept += step;
      MutexLock lock(mu_);
      if (stopping_) return;
    }
  }
}

// --engine (engine_driver.h): a member's engine, driven from its events.
Status AgentImpl::InitEngine() {
  if (opt_.engine.empty()) {
    TERN_REQUIRE(opt_.engine_sidecar.empty(), kInvalidArgument,
                 "agent: --engine-sidecar needs --engine");
    return Status::Ok();
  }
  TERN_REQUIRE(opt_.engine == "vllm" || opt_.engine == "sglang", kInvalidArgument,
               "agent: --engine ", opt_.engine, ": the engines are vllm and sglang");
  TERN_REQUIRE(!opt_.root && !opt_.relay_only && store_ != nullptr, kInvalidArgument,
               "agent: --engine is for serving members");
  TERN_ASSIGN_OR_RETURN(PauseMode pause, ParsePauseMode(opt_.engine_pause));
  char real[PATH_MAX];
  TERN_REQUIRE(::realpath(opt_.data_dir.c_str(), real) != nullptr, kInvalidArgument,
               "agent: --engine: cannot resolve ", opt_.data_dir);
  const std::string root(real);
  // Both adapters take the same policy fields.
  auto policy = [&](auto& o) {
    o.url = opt_.engine_url;
    o.root = root;
    o.pause = pause;
    o.reset_prefix_cache = opt_.engine_reset_prefix_cache;
    o.update_timeout_ms = opt_.engine_update_timeout_ms;
    o.attempts = opt_.engine_attempts;
  };
  std::unique_ptr<EngineAdapter> adapter;
  if (opt_.engine == "vllm") {
    VllmAdapterOptions vo;
    policy(vo);
    TERN_ASSIGN_OR_RETURN(adapter, VllmAdapter::Create(vo, clock_));
  } else {
    SglangAdapterOptions so;
    policy(so);
    TERN_ASSIGN_OR_RETURN(adapter, SglangAdapter::Create(so, clock_));
  }
  std::unique_ptr<EngineCommitPoint> commit;
  EngineDriverOptions driver_options;
  if (!opt_.engine_sidecar.empty()) {
    SidecarCommitOptions so;
    so.address = opt_.engine_sidecar;
    so.token = opt_.engine_sidecar_token;
    TERN_ASSIGN_OR_RETURN(commit, NewSidecarCommitPoint(so));
    // Every attempt's deadlines (the update call's plus the other steps'),
    // as the slot lease counts them.
    driver_options.commit_hold_ms =
        static_cast<uint32_t>(std::min<uint64_t>(
            UINT32_MAX, uint64_t{opt_.engine_attempts} * (opt_.engine_update_timeout_ms + 120000)));
  }
  slot_lease_ = std::make_unique<SlotLease>([this] { return CurrentSlot(); });
  engine_ = std::make_unique<EngineDriver>(*events_, *slot_lease_, std::move(adapter), opt_.engine,
                                           driver_options, clock_,
                                           [this](std::string_view line) { Log(std::string(line)); },
                                           std::move(commit));
  uint64_t served = 0;
  uint32_t served_epoch = 0;
  {
    MutexLock lock(mu_);
    served = store_version_;
    served_epoch = store_epoch_;
  }
  if (const std::string slot = CurrentSlot(); served > 0 && !slot.empty())
    engine_->Prime(served, served_epoch, slot);
  engine_->Start();
  return Status::Ok();
}

void AgentImpl::WaitEngineOffSpare() {
  if (!slot_lease_) return;
  // The longest one update may read a slot: its pause, update and the other
  // steps, each bounded by its deadline.
  const uint32_t max_wait_ms = opt_.engine_update_timeout_ms + 120000;
  slot_lease_->WaitOffSpare(max_wait_ms, [this](std::string_view line) { Log(std::string(line)); });
}

void AgentImpl::Stop() {
  MutexLock stop_lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  events_->Close();  // listeners, the hook's and the engine driver's threads wake and leave
  serve_hook_.reset();  // kills a run in flight
  engine_.reset();      // waits for an update in flight (bounded by its deadlines)
  {
    // From here on no transport handler touches the agent.
    WriterLock shut(gate_->mu);
    gate_->open = false;
  }
  std::shared_ptr<Connection> root_conn;
  std::vector<std::shared_ptr<Connection>> conns;
  bool joined = false;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    work_cv_.SignalAll();
    root_conn = root_conn_;
    for (auto& [id, c] : member_conns_) conns.push_back(c);
    for (auto& [address, p] : probes_)
      if (p.conn) conns.push_back(p.conn);
    joined = joined_;
  }
  if (root_conn && joined) {
    // Say goodbye so the root re-plans at once instead of after the silence.
    if (auto bytes = EncodeControl(Leave{}); bytes.ok()) root_conn->SendMessage(*bytes, [](Status) {});
  }
  if (work_thread_.joinable()) work_thread_.join();
  if (tick_thread_.joinable()) tick_thread_.join();
  admin_.reset();
  publish_jobs_.reset();  // waits for a publish still running
  CloseRankParts();
  rank_part_jobs_.reset();  // its parts' calls have returned or are committing
  if (listener_) listener_->Close();
  if (intra_listener_) intra_listener_->Close();
  if (root_conn) root_conn->Close();
  for (auto& c : conns) c->Close();
  fetch_server_.reset();
  relay_.reset();
  listener_.reset();
  intra_listener_.reset();
  // Hand leadership over at once (revokes the lease) rather than after it
  // lapses.
  election_.reset();
}

}  // namespace agent
}  // namespace tern
