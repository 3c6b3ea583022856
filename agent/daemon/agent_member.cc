// A member agent: joins the root, follows the parents it is given, applies
// what its relay receives, catches up from the root's object service when
// the tree cannot help (agent/daemon/agent_impl.h).
#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "agent/daemon/agent_impl.h"
#include "tern/key_set.h"
#include "agent/daemon/dial_backoff.h"
#include "agent/daemon/key_sets_file.h"
#include "base/coding.h"
#include "base/text.h"

namespace tern::agent {
namespace {

constexpr uint64_t kMaxStateBytes = 64 << 10;
// While a parent keeps failing, one log line per this many failed dials
// (at the 2 s backoff cap: about one a minute).
constexpr uint32_t kParentFailuresPerSummary = 32;
// A version whose model files cannot be had is tried this often, a second
// apart (AgentImpl::files_attempts_).
constexpr uint32_t kModelFileAttemptsMax = 10;

// The signed object's bytes, checked against its manifest entry without the
// hash list: every chunk's SHA-256 folded into the Merkle root the publisher
// signed. Used for catch-up objects, which arrive whole from the root's
// object service rather than chunk by chunk through the tree.
Status VerifyWholeObject(Env& env, const std::string& path, const ManifestObject& o) {
  TERN_ASSIGN_OR_RETURN(auto file, env.Map(path, MapMode::kReadOnly));
  const auto bytes = file->bytes();
  TERN_REQUIRE(bytes.size() == o.bytes, kAuth, path, ": ", bytes.size(), " bytes, the manifest says ",
               o.bytes);
  std::vector<Sha256Hash> hashes(o.chunk_count);
  for (uint32_t i = 0; i < o.chunk_count; ++i) {
    const uint64_t at = uint64_t{i} * o.chunk_bytes;
    hashes[i] = Sha256Of(bytes.subspan(at, std::min<uint64_t>(o.chunk_bytes, bytes.size() - at)));
  }
  TERN_REQUIRE(ChunkHashRoot(hashes) == o.chunk_hashes_root, kAuth, path,
               ": chunk hashes do not match the signed root");
  return Status::Ok();
}

}  // namespace

Status AgentImpl::InitMember() {
  TERN_REQUIRE(verifier_.key_count() > 0, kInvalidArgument,
               "agent: a member needs the publisher's public key (--trust-key)");
  std::vector<std::string> join;
  for (size_t at = 0; at <= opt_.join.size();) {
    const size_t comma = std::min(opt_.join.find(',', at), opt_.join.size());
    if (comma > at) join.push_back(opt_.join.substr(at, comma - at));
    at = comma + 1;
  }
  TERN_REQUIRE(!join.empty() && join.size() <= 16, kInvalidArgument,
               "agent: --join wants 1..16 comma-separated root addresses");
  BoardId board{};
  const std::string state_path = opt_.data_dir + "/agent.json";
  TERN_ASSIGN_OR_RETURN(FileType type, env_.TypeOf(state_path, true));
  if (type == FileType::kRegular) {
    std::string text;
    TERN_RETURN_IF_ERROR(ReadFileToString(env_, state_path, kMaxStateBytes, &text));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("board_id") || !j["board_id"].is_string() ||
        !ParseHex(j["board_id"].get<std::string>(), board))
      return TERN_ERROR(kCorrupt, state_path, ": not an agent state file (board_id missing or malformed)");
  }
  LoadMemberKeySets();
  {
    // The relay starts with an empty table: objects (and partial ones) of
    // an earlier run are never offered again, so they go rather than pile
    // up. The served view and its kept patch live in views/, not here.
    if (auto names = env_.ListDir(objects_dir_, 4096); names.ok()) {
      for (const auto& name : *names) env_.RemoveFile(objects_dir_ + "/" + name).IgnoreError();
    } else {
      Log("cannot clear " + objects_dir_ + ": " + names.status().ToString());
    }
  }
  MutexLock lock(mu_);
  join_addresses_ = std::move(join);
  board_id_ = board;
  if (board_id_ != BoardId{}) TERN_RETURN_IF_ERROR(EnsureRelay(board_id_).status());
  return Status::Ok();
}

Status AgentImpl::SaveMemberState() {
  nlohmann::json j;
  j["member_id"] = id_;
  j["board_id"] = Hex(board_id_);
  const std::string text = j.dump(2) + "\n";
  return WriteFileAtomic(env_, opt_.data_dir + "/agent.json",
                         {reinterpret_cast<const uint8_t*>(text.data()), text.size()}, true);
}

// Under mu_.
Result<RelayNode*> AgentImpl::EnsureRelay(const BoardId& board) {
  if (relay_) return relay_.get();
  RelayCallbacks cb;
  cb.on_manifest = [this](const std::string& signed_manifest, const VersionManifest& m) {
    return MemberAcceptManifest(signed_manifest, m);
  };
  cb.on_object_complete = [this](const ObjectRef& ref, const std::string& path) {
    if (opt_.relay_only) return RelayOnlyObjectComplete(ref);
    {
      MutexLock lock(mu_);
      relay_held_.insert(ref);
      if (ref.to > store_version_) complete_at_s_.try_emplace(ref.to, NowS());
    }
    Post([this, ref, path] { MemberObjectComplete(ref, path); });
  };
  if (opt_.stream_apply && !opt_.relay_only) {
    cb.on_prefix_verified = [this](const ObjectRef& ref, const std::string& part_path,
                                   uint64_t bytes) {
      Post([this, ref, part_path, bytes] { MemberObjectPrefix(ref, part_path, bytes); });
    };
  }
  cb.on_parent_failed = [this](uint32_t stripe, const Status& why, ParentLoss loss) {
    MutexLock lock(mu_);
    // Dropped for content that failed verification: the root hears of it.
    // A TLS certificate refused at the dial, or a manifest signed by a key
    // this member does not trust (kAuth, kLink), is not that: a
    // misconfigured or impostor parent is planned around when it stalls, and
    // a key set this member has not applied yet arrives on its control
    // connection.
    if (loss == ParentLoss::kBadContent && stripe < watch_.size())
      watch_[stripe].failed_auth = true;
    if (stripe >= parent_redial_.size() || stripe >= parents_.parents.size()) return;
    // Dial again with backoff unless the root moves us meanwhile (it
    // re-plans when the parent is gone for good). The first failure is
    // logged; the rest are summed up when the run ends (PARENTS) and every
    // kParentFailuresPerSummary failures while it lasts.
    ParentRedial& r = parent_redial_[stripe];
    const bool first = ParentFailed(r, clock_.NowUs());
    const std::string who =
        "parent " + parents_.parents[stripe].id + " of stripe " + std::to_string(stripe);
    if (first) {
      Log(who + " failed: " + why.ToString() + "; dialling it again with backoff (up to " +
          std::to_string(kParentRedialUsMax / 1000) + " ms) until the root moves us");
    } else if (r.failures % kParentFailuresPerSummary == 0) {
      Log(who + ": " + std::to_string(r.failures) + " dials failed in " +
          std::to_string((clock_.NowUs() - r.first_failure_us) / 1000) +
          " ms; last: " + why.ToString());
    }
  };
  TERN_RETURN_IF_ERROR(MakeRelay(board, std::move(cb)));
  return relay_.get();
}

void AgentImpl::MemberDial() {
  std::string address;
  {
    MutexLock lock(mu_);
    if (stopping_ || root_conn_ || dialing_ || clock_.NowUs() < next_dial_us_) return;
    dialing_ = true;
    dial_address_ = join_addresses_[join_index_ % join_addresses_.size()];
    address = dial_address_;
  }
  ConnectionHandlers h;
  auto self_conn = std::make_shared<std::weak_ptr<Connection>>();
  h.on_message = [this, gate = gate_](std::string payload) {
    ReaderLock open(gate->mu);
    if (!gate->open) return;
    auto m = DecodeControl(payload);
    if (!m.ok()) {
      Log("bad control message from the root: " + m.status().ToString());
      std::shared_ptr<Connection> c;
      {
        MutexLock lock(mu_);
        c = root_conn_;
      }
      if (c) c->Close();
      return;
    }
    MemberOnControl(std::move(m).value());
  };
  h.on_closed = [this, self_conn, gate = gate_](Status why) {
    ReaderLock open(gate->mu);
    if (gate->open) MemberOnClosed(self_conn->lock(), why);
  };
  opt_.transport->Connect(address, std::move(h), [this, self_conn, gate = gate_](Result<std::shared_ptr<Connection>> r) {
    ReaderLock open(gate->mu);
    if (!gate->open) {
      if (r.ok()) (*r)->Close();
      return;
    }
    Outbox out;
    {
      MutexLock lock(mu_);
      dialing_ = false;
      if (!r.ok()) {
        ++join_index_;  // a standby root may lead now
        const DialRetry retry = AfterFailedDial(dial_backoff_us_, join_index_, join_addresses_.size());
        dial_backoff_us_ = retry.backoff_us;
        next_dial_us_ = clock_.NowUs() + retry.wait_us;
        if (!dial_failed_logged_) Log("cannot reach the root at " + opt_.join + ": " + r.status().ToString());
        dial_failed_logged_ = true;
        return;
      }
      if (stopping_) {
        out.push_back({*r, ""});
      } else {
        *self_conn = *r;
        root_conn_ = *r;
        root_link_since_us_ = clock_.NowUs();
        Hello hello;
        hello.member.id = id_;
        hello.member.region = opt_.region;
        hello.member.cluster = opt_.cluster;
        hello.member.island = opt_.island;
        hello.member.data_address = listen_address_;
        hello.member.intra_address = intra_address_;
        // The backend actually running (a fallback leaves none at all), so
        // the root pairs only members whose intra transports can talk.
        if (!intra_address_.empty()) hello.member.intra_backend = opt_.intra_transport->name();
        hello.member.may_relay = opt_.may_relay;
        hello.member.relay_only = opt_.relay_only;
        hello.member.uplink_bytes_per_s = opt_.uplink_bytes_per_s;
        hello.member.downlink_bytes_per_s = opt_.downlink_bytes_per_s;
        hello.board_id = board_id_;
        hello.served_version = VersionLocked();
        hello.join_token = opt_.join_token;
        Send(out, *r, hello);
      }
    }
    if (!out.empty() && out[0].payload.empty()) {
      out[0].conn->Close();
      return;
    }
    Flush(out);
  });
}

void AgentImpl::MemberOnClosed(const std::shared_ptr<Connection>& conn, const Status& why) {
  MutexLock lock(mu_);
  if (conn && root_conn_ != conn) return;
  root_conn_.reset();
  if (joined_) Log("lost the root: " + why.ToString());
  if (!joined_ || !why.ok()) ++join_index_;  // try the next root address
  joined_ = false;
  dial_backoff_us_ = std::max(dial_backoff_us_, kDialBackoffUsMin);
  next_dial_us_ = clock_.NowUs() + dial_backoff_us_;
}

void AgentImpl::MemberOnKeySets(const KeySets& m) {
  bool learned = false;
  for (const std::string& signed_key_set : m.signed_key_sets) {
    auto ks = ApplyKeySet(verifier_, signed_key_set);
    if (ks.ok()) {
      Log("key set " + std::to_string(ks->seq) + " applied: " + std::to_string(ks->keys.size()) +
          " keys, " + std::to_string(ks->revoked.size()) + " revoked");
      learned_key_sets_.push_back(signed_key_set);
      learned = true;
    } else if (ks.status().code() != Code::kAlreadyExists) {
      // The later ones cannot chain without this one.
      Log("refused a key set: " + ks.status().ToString());
      break;
    }
  }
  if (learned) {
    Status s = SaveMemberKeySets();
    if (!s.ok()) Log("cannot save DIR/key-sets: " + s.ToString());
  }
}

// DIR/key-sets (key_sets_file.h).
Status AgentImpl::SaveMemberKeySets() {
  return WriteKeySetsFile(env_, opt_.data_dir + "/key-sets", learned_key_sets_);
}

void AgentImpl::LoadMemberKeySets() {
  const std::string path = opt_.data_dir + "/key-sets";
  auto file = ReadKeySetsFile(env_, path);
  if (!file.ok()) {
    Log("ignoring " + path + ": " + file.status().ToString());
    return;
  }
  if (file->key_sets.empty() && file->rest.ok()) return;
  MutexLock lock(mu_);
  for (std::string& record : file->key_sets) {
    auto ks = ApplyKeySet(verifier_, record);
    if (!ks.ok()) {
      // Set 0 changed (--trust-key), or the file was altered: the root
      // sends the chain again at the next join.
      Log(path + ": key set not applied: " + ks.status().ToString());
      return;
    }
    learned_key_sets_.push_back(std::move(record));
  }
  if (!file->rest.ok()) Log(file->rest.message() + "; key sets after it not loaded");
  Log("key set " + std::to_string(verifier_.key_set_seq()) + " from " + path);
}

void AgentImpl::MemberOnControl(ControlMessage msg) {
  Outbox out;
  std::shared_ptr<Connection> close;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    if (auto* w = std::get_if<Welcome>(&msg)) {
      if (board_id_ != BoardId{} && w->board_id != board_id_) {
        Log("the root at " + opt_.join + " runs another board; not joining");
        close = root_conn_;
        next_dial_us_ = clock_.NowUs() + kDialBackoffUsMax;
      } else {
        const bool first = board_id_ == BoardId{};
        board_id_ = w->board_id;
        // This root numbers its plans afresh (a standby that took over
        // starts at its own epoch): its PARENTS, which follow, count.
        parents_.epoch = 0;
        if (first) {
          Status s = SaveMemberState();
          if (!s.ok()) Log("cannot save DIR/agent.json: " + s.ToString());
        }
        auto relay = EnsureRelay(board_id_);
        if (!relay.ok()) Log("no relay: " + relay.status().ToString());
        joined_ = true;
        dial_backoff_us_ = kDialBackoffUsMin;
        dial_failed_logged_ = false;
        // WELCOME carries HEAD's number only: its epoch comes with the
        // signed HEAD the root sends next (a supersede's number is lower).
        NoteHeadLocked(known_head_epoch_, w->head);
        fetch_address_ = w->fetch_address;
        stripes_ = w->stripes;
        // The root's timing rules: its dead-after counts this member's
        // heartbeats, and its stall rule assumes its own stall time.
        if (board_heartbeat_ms_.load() != w->heartbeat_ms ||
            board_parent_stall_ms_ != w->parent_stall_ms) {
          if (w->heartbeat_ms != opt_.heartbeat_ms || w->parent_stall_ms != opt_.parent_stall_ms) {
            const auto stall = [](uint32_t ms) {
              return ms == 0 ? std::string("never") : "after " + std::to_string(ms) + " ms";
            };
            Log("the root's timing rules: heartbeat every " + std::to_string(w->heartbeat_ms) +
                " ms, a stalled parent reported " + stall(w->parent_stall_ms) +
                " (this agent's flags said " + std::to_string(opt_.heartbeat_ms) + " ms and " +
                stall(opt_.parent_stall_ms) + ")");
          }
          board_heartbeat_ms_ = w->heartbeat_ms;
          board_parent_stall_ms_ = w->parent_stall_ms;
        }
        Log("joined; HEAD " + std::to_string(w->head) +
            (opt_.relay_only ? ", relay-only, holding " : ", serving ") +
            std::to_string(VersionLocked()));
        need_catch_up_check_ = !opt_.relay_only;
      }
    } else if (auto* p = std::get_if<Parents>(&msg); p && p->epoch < parents_.epoch) {
      // The root sends PARENTS from whichever thread re-planned, after its
      // lock: two re-plans in quick succession can arrive in either order.
      // An older plan must not replace a newer one (the member would then
      // report a parent the root no longer gives it, and starve).
      Log("ignoring PARENTS of plan " + std::to_string(p->epoch) + ": already at plan " +
          std::to_string(parents_.epoch));
    } else if (p) {
      const uint64_t now_us = clock_.NowUs();
      for (size_t s = 0; s < parent_redial_.size() && s < parents_.parents.size(); ++s) {
        const ParentRedial& r = parent_redial_[s];
        if (r.failures > 1)
          Log("parent " + parents_.parents[s].id + " of stripe " + std::to_string(s) + ": " +
              std::to_string(r.failures) + " dials failed in " +
              std::to_string((now_us - r.first_failure_us) / 1000) +
              " ms before the root moved us");
      }
      parents_ = *p;
      // A new parent (or the same one again) is dialled at once.
      parent_redial_.assign(parents_.parents.size(), ParentRedial{});
      for (auto& r : parent_redial_) ParentAssigned(r);
    } else if (auto* h = std::get_if<Head>(&msg)) {
      auto m = verifier_.Verify(h->signed_manifest);
      if (!m.ok() || m->board_id != board_id_ || m->version != h->head) {
        Log("ignoring a HEAD whose manifest does not verify: " +
            (m.ok() ? std::string("board or version mismatch") : m.status().ToString()));
      } else {
        NoteHeadLocked(m->epoch, h->head);
        manifests_[h->head] = *m;
        TrimManifestsLocked();
        need_catch_up_check_ = true;
      }
    } else if (auto* beacon = std::get_if<Beacon>(&msg)) {
      MemberOnBeaconLocked(*beacon);
    } else if (auto* key_sets = std::get_if<KeySets>(&msg)) {
      MemberOnKeySets(*key_sets);
    } else if (auto* pong = std::get_if<Pong>(&msg)) {
      if (const double rtt = RoundTripOf(pong->nonce); rtt > 0) rtt_to_root_s_ = rtt;
    } else if (auto* r = std::get_if<Reject>(&msg)) {
      Log("the root refused to let us join: " + r->reason);
      // A standby that lost leadership refuses too: try the next address soon.
      next_dial_us_ = clock_.NowUs() + (join_addresses_.size() > 1 ? kDialBackoffUsMin : kDialBackoffUsMax);
      close = root_conn_;
    } else if (auto* plan = std::get_if<CatchUpReply>(&msg); plan && !opt_.relay_only) {
      CatchUpReply copy = *plan;
      work_.push_back([this, copy]() mutable { MemberCatchUp(std::move(copy)); });
      work_cv_.Signal();
    } else {
      Log(std::string("unexpected ") + ControlTypeName(TypeOf(msg)) + " from the root");
    }
  }
  Flush(out);
  if (close) close->Close();
}

BoardPos AgentImpl::PosOfLocked(uint64_t v) const {
  if (opt_.root && board_) {
    if (auto pos = board_->PosOf(v); pos.ok()) return *pos;
  }
  if (auto it = manifests_.find(v); it != manifests_.end()) return {it->second.epoch, v};
  return {ServedEpochLocked(), v};
}

// At most 64 manifests kept; the lowest position goes first (a supersede's
// versions are numbered below the withdrawn ones, which must go before them).
void AgentImpl::TrimManifestsLocked() {
  while (manifests_.size() > 64) {
    auto lowest = manifests_.begin();
    for (auto it = manifests_.begin(); it != manifests_.end(); ++it)
      if (BoardPos{it->second.epoch, it->first} < BoardPos{lowest->second.epoch, lowest->first})
        lowest = it;
    manifests_.erase(lowest);
  }
}

bool AgentImpl::MemberAcceptManifest(const std::string&, const VersionManifest& m) {
  MutexLock lock(mu_);
  // Replay protection: a version at a lower position (epoch, version) than
  // the one served is refused (a relay replaying an old, validly signed
  // version cannot roll us back; docs/agent/board.md §4a: nor an old epoch,
  // whatever its number). The served version itself is accepted so that
  // children still get it. A relay-only member applies nothing, but its
  // children would refuse the same manifest: it neither holds nor forwards it.
  if (BoardPos{m.epoch, m.version} < PosLocked()) {
    // Epochs named once there are any (the log line before them stays).
    const bool epochs = m.epoch != 0 || ServedEpochLocked() != 0;
    auto of = [&](uint32_t e) { return epochs ? " of epoch " + std::to_string(e) : std::string(); };
    Log("refusing a manifest for version " + std::to_string(m.version) + of(m.epoch) + ": " +
        (opt_.relay_only ? "holding " : "serving ") + std::to_string(VersionLocked()) +
        of(ServedEpochLocked()));
    return false;
  }
  NoteHeadLocked(m.epoch, m.version);
  // Its model files are applied with it (MemberModelFiles).
  manifests_[m.version] = m;
  TrimManifestsLocked();
  return true;
}

void AgentImpl::MemberObjectComplete(const ObjectRef& ref, const std::string& path) {
  {
    MutexLock lock(mu_);
    if (PosOfLocked(ref.to) <= PosLocked()) return;  // already there (caught up meanwhile)
    // Keep the cheapest route to each target: a patch beats a keyframe.
    auto it = ready_.find(ref.to);
    if (it == ready_.end() || (it->second.first.kind == ObjectKind::kKeyframe && ref.kind != ObjectKind::kKeyframe))
      ready_[ref.to] = {ref, path};
  }
  MemberTryApply();
}

// From the relay's thread: a relay-only member holds `ref` completely (every
// chunk verified). It applies nothing; its version is the newest it holds,
// and what is kKeepVersions older goes (from the relay and from disk), so
// that what it keeps is bounded by versions, not by how long it runs.
void AgentImpl::RelayOnlyObjectComplete(const ObjectRef& ref) {
  Outbox out;
  bool newer = false;
  const RelayFigures figures = ReadRelayFigures();
  std::vector<ObjectRef> old;
  {
    MutexLock lock(mu_);
    relay_held_.insert(ref);
    if (PosOfLocked(ref.to) > PosLocked()) {
      newer = true;
      held_epoch_ = PosOfLocked(ref.to).epoch;
      held_version_ = ref.to;
      old = ForgetOldObjectsLocked(held_version_, 4);
      // The root's lag for this member follows at once.
      if (root_conn_ && joined_) Send(out, root_conn_, MakeHeartbeatLocked(figures));
    }
  }
  Flush(out);
  ForgetObjects(old);
  if (newer)
    Log("holding version " + std::to_string(ref.to) + " (" + ObjectName(ref) + "), relay-only");
}

// On the work thread.
void AgentImpl::MemberTryApply() {
  for (;;) {
    std::pair<ObjectRef, std::string> next;
    {
      MutexLock lock(mu_);
      // What no longer leads past the served position (by epoch and number).
      for (auto it = ready_.begin(); it != ready_.end();)
        it = PosOfLocked(it->first) <= PosLocked() ? ready_.erase(it) : std::next(it);
      auto pick = ready_.end();
      for (auto it = ready_.begin(); it != ready_.end(); ++it) {
        const ObjectRef& r = it->second.first;
        if ((r.kind == ObjectKind::kKeyframe) || r.from == store_version_) {
          // A keyframe only when nothing chains from what we serve.
          if (r.kind == ObjectKind::kKeyframe && store_version_ != 0) {
            bool chain = false;
            for (auto& [v, o] : ready_) chain |= o.first.kind != ObjectKind::kKeyframe && o.first.from == store_version_;
            if (chain) continue;
          }
          pick = it;
          break;
        }
      }
      if (pick == ready_.end()) return;
      next = pick->second;
      ready_.erase(pick);
    }
    // Its model files first (fetched and checked here, cached for the apply).
    if (auto files = MemberModelFiles(next.first.to); !files.ok()) {
      MutexLock lock(mu_);
      files_attempts_.erase(files_attempts_.begin(), files_attempts_.upper_bound(store_version_));
      const uint32_t attempts = ++files_attempts_[next.first.to];
      Log("cannot apply " + ObjectName(next.first) + ": " + files.status().ToString() +
          (attempts < kModelFileAttemptsMax ? " (trying again in a second)"
                                             : " (given up: waiting for the next version)"));
      if (attempts < kModelFileAttemptsMax) {
        ready_.try_emplace(next.first.to, next);
        files_retry_us_ = clock_.NowUs() + 1'000'000;
      }
      return;
    }
    Status s = MemberApplyObject(next.first, next.second);
    if (!s.ok()) Log("cannot apply " + ObjectName(next.first) + ": " + s.ToString());
  }
}

// On the work thread: the verified first `bytes` of an object still
// arriving. A patch from the served version goes into the spare record by
// record (ViewStore::AdvancePrefix), only if the spare is ready (the reader
// rule) and no other patch is streaming; MemberApplyObject finishes it.
void AgentImpl::MemberObjectPrefix(const ObjectRef& ref, const std::string& part_path,
                                   uint64_t bytes) {
  if (ref.kind != ObjectKind::kPatch || ref.from != store_->version()) return;
  if (stream_file_ && stream_ref_ != ref) {
    if (store_->advancing()) return;  // another patch streams
    stream_file_.reset();             // its stream was dropped or never began
  }
  if (!stream_file_) {
    if (!store_->spare_ready()) return;
    auto file = env_.Map(part_path, MapMode::kReadOnly);
    if (!file.ok()) return;  // completed and renamed meanwhile: applied whole
    stream_file_ = std::move(file).value();
    stream_ref_ = ref;
  }
  if (bytes > stream_file_->size()) return;
  WaitEngineOffSpare();
  if (Status s = store_->AdvancePrefix(stream_file_->bytes().first(bytes)); !s.ok()) {
    Log("cannot stream " + ObjectName(ref) + " into the spare: " + s.ToString() +
        " (applied whole once complete)");
  }
}

// On the work thread.
Status AgentImpl::MemberApplyObject(const ObjectRef& ref, const std::string& path) {
  const double t0 = NowS();
  // The whole process's CPU (the pool's threads apply too; the network
  // threads' share in the meantime is counted as well: an upper bound).
  timespec cpu0{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
  TERN_ASSIGN_OR_RETURN(auto file, env_.Map(path, MapMode::kReadOnly));
  const auto bytes = file->bytes();
  TERN_ASSIGN_OR_RETURN(std::vector<SlotFile> files, MemberModelFiles(ref.to));
  // For the served event: the tensors the patch changes (its manifest).
  bool all = ref.kind == ObjectKind::kKeyframe;
  std::vector<std::string> changed;
  if (!all) changed = ChangedTensors(bytes, &all);
  // For the root's format choice: this patch's format and view size, and
  // whether the spare was ready or a stream into it began (else the apply
  // first brings it up: a copy of the view that is not the patch's cost).
  uint16_t format = 0;
  uint64_t view_bytes = 0;
  const bool prepared = store_->spare_ready() || store_->advancing();
  if (ref.kind != ObjectKind::kKeyframe) {
    if (auto head = InspectHead(bytes); head.ok() && head->has_value()) {
      // Version 3 is what format 2's writer emits when it codes a tensor as
      // nibbles: the same format for the root's choice.
      format = (*head)->format_version == 3 ? 2 : (*head)->format_version;
      for (const TensorPatchInfo& t : (*head)->tensors) view_bytes += DTypeBytes(t.dtype, t.elements);
    }
  }
  // The epoch the object leads to, from its signed manifest (accepted
  // before its bytes were): a supersede's patch runs backwards into it.
  uint32_t epoch = 0;
  const uint64_t before = store_->version();
  {
    MutexLock lock(mu_);
    auto m = manifests_.find(ref.to);
    TERN_REQUIRE(m != manifests_.end(), kNotFound, "no signed manifest of version ", ref.to,
                 " is held for ", ObjectName(ref));
    epoch = m->second.epoch;
  }
  WaitEngineOffSpare();
  if (ref.kind == ObjectKind::kKeyframe) {
    TERN_RETURN_IF_ERROR(store_->InstallKeyframe(bytes, ref.to, files, epoch));
  } else {
    // Finishes the stream of this patch, if one began (or drops another's).
    Status s = store_->Advance(bytes, files, epoch);
    stream_file_.reset();
    TERN_RETURN_IF_ERROR(s);
  }
  stream_file_.reset();  // any stream is over: the store dropped it
  const double dt = NowS() - t0;
  timespec cpu1{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
  const double cpu_s =
      double(cpu1.tv_sec - cpu0.tv_sec) + double(cpu1.tv_nsec - cpu0.tv_nsec) * 1e-9;
  double waited_s = 0;
  Outbox out;
  const RelayFigures figures = ReadRelayFigures();
  std::vector<ObjectRef> old;
  {
    MutexLock lock(mu_);
    if (auto it = complete_at_s_.find(ref.to); it != complete_at_s_.end())
      waited_s = t0 - it->second;
    complete_at_s_.erase(complete_at_s_.begin(), complete_at_s_.upper_bound(store_->version()));
    NoteServedLocked();
    // A re-base onto a supersede's lower number: our parents offer what
    // lies above the version we subscribed with (numbers), so subscribe
    // again with the new one (docs/agent/board.md §4a).
    if (store_version_ < before) {
      for (auto& r : parent_redial_) ParentAssigned(r);
      Log("re-based from version " + std::to_string(before) + " to " +
          std::to_string(store_version_) + " of epoch " + std::to_string(store_epoch_) +
          "; subscribing to our parents again");
    }
    last_apply_s_ = dt;
    NoteApplyRateLocked(format, view_bytes, dt, prepared);
    spare_due_us_ = clock_.NowUs() + uint64_t{opt_.spare_grace_ms} * 1000;
    // Children a few versions behind still get these from us; older ones
    // come from the root's catch-up service.
    old = ForgetOldObjectsLocked(store_version_, 4);
    // Tell the root at once: time-to-serve is measured from this heartbeat.
    if (root_conn_ && joined_) Send(out, root_conn_, MakeHeartbeatLocked(figures));
  }
  Flush(out);
  ForgetObjects(old);
  EmitServed(ref.to, store_->digest(), all, std::move(changed));
  MemberForgetModelFiles();
  Log("serving version " + std::to_string(ref.to) + " (" + ObjectName(ref) + ", applied in " +
      std::to_string(dt) + " s, waited " + std::to_string(waited_s) +
      " s for the work thread, process cpu " + std::to_string(cpu_s) + " s)");
  return Status::Ok();
}

void AgentImpl::NoteApplyRateLocked(uint16_t format, uint64_t view_bytes, double apply_s,
                                    bool prepared) {
  if ((format != 1 && format != 2) || view_bytes == 0 || !(apply_s > 0)) return;
  NoteApplyRate(apply_rate_, format, double(view_bytes) / apply_s, prepared);
}

void AgentImpl::MemberSeed(const VersionManifest& m) {
  const double t0 = NowS();
  // Seed copies the checkpoint and compares its full digest with the signed
  // one before anything is switched: a wrong or damaged checkpoint changes
  // nothing.
  auto files = MemberModelFiles(m.version);
  WaitEngineOffSpare();
  Status s = files.ok() ? store_->Seed(opt_.seed_checkpoint, m.version, m.target_digest, *files,
                                       m.epoch)
                        : files.status();
  Outbox out;
  const RelayFigures figures = ReadRelayFigures();
  {
    MutexLock lock(mu_);
    seed_pending_ = false;
    if (s.ok()) {
      NoteServedLocked();
      last_apply_s_ = NowS() - t0;
      spare_due_us_ = clock_.NowUs() + uint64_t{opt_.spare_grace_ms} * 1000;
      if (root_conn_ && joined_) Send(out, root_conn_, MakeHeartbeatLocked(figures));
    }
  }
  Flush(out);
  if (!s.ok()) {
    Log("seed checkpoint " + opt_.seed_checkpoint + " refused for version " + std::to_string(m.version) +
        ": " + s.ToString() + "; catching up without it");
    return;
  }
  EmitServed(m.version, m.target_digest, /*all=*/true, {});
  Log("serving version " + std::to_string(m.version) + " (seeded from " + opt_.seed_checkpoint +
      ", its digest is the signed one; " + std::to_string(NowS() - t0) + " s)");
}

// On the work thread, a grace period after a switch (the reader rule): the
// catch-up of the spare, so that the next version only applies its patch.
// Anything that completed meanwhile was applied first (the work thread is
// serial); a version arriving during it waits for it.
void AgentImpl::MemberPrepareSpare() {
  const double t0 = NowS();
  WaitEngineOffSpare();
  if (Status s = store_->PrepareSpare(); !s.ok()) {
    Log("cannot prepare the spare view: " + s.ToString());
    return;
  }
  Log("spare view ready in " + std::to_string(NowS() - t0) + " s");
}

// On the work thread: fetch every object of the plan from the root's object
// service, verify it against a signed manifest, apply in order.
void AgentImpl::MemberCatchUp(CatchUpReply plan) {
  std::string fetch_address;
  BoardId board{};
  {
    MutexLock lock(mu_);
    fetch_address = fetch_address_;
    board = board_id_;
    catching_up_ = true;
  }
  auto done = [this] {
    MutexLock lock(mu_);
    catching_up_ = false;
  };
  std::vector<VersionManifest> manifests;
  for (const auto& s : plan.signed_manifests) {
    auto m = verifier_.Verify(s);
    if (!m.ok() || m->board_id != board) {
      Log("catch-up plan has a manifest that does not verify; ignoring the plan");
      return done();
    }
    manifests.push_back(std::move(m).value());
  }
  {
    // Their model files are applied with them (MemberModelFiles).
    MutexLock lock(mu_);
    for (const VersionManifest& m : manifests)
      if (BoardPos{m.epoch, m.version} >= PosLocked()) manifests_[m.version] = m;
    TrimManifestsLocked();
  }
  bool seed = false;
  {
    MutexLock lock(mu_);
    seed = seed_pending_;
  }
  if (seed) {
    const VersionManifest* own = nullptr;
    for (const auto& m : manifests)
      if (m.version == opt_.seed_version) own = &m;
    if (own) {
      MemberSeed(*own);
    } else {
      Log("catch-up plan carries no manifest of seed version " + std::to_string(opt_.seed_version) +
          "; seed dropped");
      MutexLock lock(mu_);
      seed_pending_ = false;
    }
  }
  for (const ObjectRef& ref : plan.objects) {
    {
      // The tree may have moved us on meanwhile: skip what no longer fits
      // (the periodic check asks again if the rest does not come).
      MutexLock lock(mu_);
      if (PosOfLocked(ref.to) <= PosLocked()) continue;
      if (ref.kind != ObjectKind::kKeyframe && ref.from != store_version_) break;
    }
    const ManifestObject* entry = nullptr;
    for (const auto& m : manifests)
      for (const auto& mo : m.objects)
        if (mo.kind == ref.kind && mo.from_version == ref.from && mo.to_version == ref.to && m.version == ref.to)
          entry = &mo;
    if (!entry) {
      Log("catch-up object " + ObjectName(ref) + " is in no signed manifest; stopping");
      return done();
    }
    const std::string local = opt_.data_dir + "/catchup/" + ObjectName(ref);
    if (Status s = CreateDirs(env_, opt_.data_dir + "/catchup"); !s.ok()) {
      Log("catch-up: " + s.ToString());
      return done();
    }
    FetchOptions fo;
    fo.chunk_bytes = entry->chunk_bytes;
    fo.access_token = opt_.join_token;  // the root's object service requires it
    auto fetched = FetchFile(*opt_.transport, fetch_address, ObjectName(ref), local, fo, clock_);
    if (!fetched.ok()) {
      Log("catch-up fetch of " + ObjectName(ref) + " failed: " + fetched.status().ToString());
      return done();
    }
    Status s = VerifyWholeObject(env_, local, *entry);
    if (s.ok()) s = MemberApplyObject(ref, local);
    env_.RemoveFile(local).IgnoreError();
    if (!s.ok()) {
      Log("catch-up object " + ObjectName(ref) + " refused: " + s.ToString());
      return done();
    }
    Log("catch-up: " + ObjectName(ref) + " (" + std::to_string(fetched->bytes) +
        " bytes) came from the board's object service");
  }
  done();
  MemberTryApply();
}

std::vector<ObjectRef> AgentImpl::ForgetOldObjectsLocked(uint64_t served, uint64_t keep_versions) {
  std::vector<ObjectRef> forgotten;
  for (auto it = relay_held_.begin(); it != relay_held_.end();) {
    // By number within the served epoch; everything leading to a version
    // of an older epoch (withdrawn by a supersede, docs/agent/board.md §4a)
    // too: the supersede's own patch leads into the served epoch and stays.
    const uint32_t epoch = PosOfLocked(it->to).epoch;
    if (epoch < ServedEpochLocked() ||
        (epoch == ServedEpochLocked() && it->to + keep_versions <= served)) {
      forgotten.push_back(*it);
      it = relay_held_.erase(it);
    } else {
      ++it;
    }
  }
  return forgotten;
}

void AgentImpl::ForgetObjects(const std::vector<ObjectRef>& refs) {
  if (refs.empty()) return;
  RelayNode* relay = RelayNow();  // relay_held_ had these: the relay exists
  for (const ObjectRef& ref : refs) {
    if (relay) relay->Forget(ref);
    if (!opt_.root) env_.RemoveFile(objects_dir_ + "/" + ObjectName(ref)).IgnoreError();
  }
}

RelayNode* AgentImpl::RelayNow() const {
  MutexLock lock(mu_);
  return relay_.get();
}

AgentImpl::RelayFigures AgentImpl::ReadRelayFigures() {
  const RelayNode* relay = RelayNow();
  RelayFigures f;
  if (relay) {
    f.links = relay->Stats();
    f.totals = relay->Totals();
  }
  return f;
}

Heartbeat AgentImpl::MakeHeartbeatLocked(const RelayFigures& relay) {
  Heartbeat hb;
  hb.seq = ++heartbeat_seq_;
  hb.served_version = VersionLocked();
  hb.last_apply_s = last_apply_s_;
  hb.rtt_to_root_s = rtt_to_root_s_;
  std::tie(hb.apply_f1_bytes_per_s, hb.apply_f2_bytes_per_s) =
      ReportedApplyRates(apply_rate_[0], apply_rate_[1]);
  // Per stripe: the parent's round trip and the rate the last object came
  // at from it; rtt_to_parent_s is the slowest parent's.
  const std::vector<LinkStats>& links = relay.links;
  for (const auto& p : parents_.parents) {
    ParentFigures f;
    if (auto it = probes_.find(p.data_address); it != probes_.end()) f.rtt_s = it->second.rtt_s;
    for (const auto& l : links)
      if (l.parent && l.stripe == p.stripe)
        f.rate_in_bytes_per_s = std::max(f.rate_in_bytes_per_s, l.last_rate_in_bytes_per_s);
    hb.rtt_to_parent_s = std::max(hb.rtt_to_parent_s, f.rtt_s);
    hb.parents.push_back(f);
  }
  if (relay_) {
    // Totals over every link this member ever had: the root exports them
    // as counters, which must not go down when a link closes.
    const LinkTotals& totals = relay.totals;
    hb.bytes_in = sent_totals_.bytes_in = std::max(sent_totals_.bytes_in, totals.bytes_in);
    hb.bytes_out = sent_totals_.bytes_out = std::max(sent_totals_.bytes_out, totals.bytes_out);
    hb.chunk_retries = sent_totals_.chunk_retries =
        std::max(sent_totals_.chunk_retries, totals.retries + totals.bad_chunks);
    // The rate the last object arrived at from a parent (the planner's
    // figure for this member's downlink as the tree sees it).
    for (const auto& l : links)
      if (l.parent) {
        hb.rate_in_bytes_per_s = std::max(hb.rate_in_bytes_per_s, l.last_rate_in_bytes_per_s);
        hb.wire_bytes_in += l.wire_bytes_in;
      }
  }
  return hb;
}

void AgentImpl::MemberTick() {
  MemberDial();
  Outbox out;
  std::vector<ParentRef> redial;
  uint32_t stripes = 1;
  RelayNode* relay = nullptr;
  bool catch_up = false;
  std::string note;  // logged outside mu_
  bool prepare_spare = false;
  std::shared_ptr<Connection> cut_off;
  bool retry_apply = false;
  const RelayFigures figures = ReadRelayFigures();
  {
    MutexLock lock(mu_);
    cut_off = MemberCutOffLocked();
    if (spare_due_us_ != 0 && clock_.NowUs() >= spare_due_us_) {
      spare_due_us_ = 0;
      prepare_spare = true;
    }
    if (files_retry_us_ != 0 && clock_.NowUs() >= files_retry_us_) {
      files_retry_us_ = 0;
      retry_apply = true;
    }
    if (root_conn_ && joined_) {
      Send(out, root_conn_, MakeHeartbeatLocked(figures));
      Send(out, root_conn_, Ping{clock_.NowUs()});
      const uint64_t now_us = clock_.NowUs();
      if (catching_up_ && now_us > catch_up_deadline_us_) {  // no answer came
        catching_up_ = false;
        if (seed_pending_) {
          // The root has no manifest of that version (never published, or
          // retention dropped it): go on without the seed.
          seed_pending_ = false;
          note = "no signed manifest of seed version " + std::to_string(opt_.seed_version) + " came; seed dropped";
        }
      }
      if (seed_pending_ && store_version_ >= opt_.seed_version) seed_pending_ = false;  // the tree got there
      if (seed_pending_ && known_head_ > 0 && known_head_ < opt_.seed_version) {
        note = "seed checkpoint of version " + std::to_string(opt_.seed_version) + " is newer than HEAD " +
               std::to_string(known_head_) + ": not this board's; dropped";
        seed_pending_ = false;
      }
      if (seed_pending_) {
        // Ask for the seed's signed manifest (and the route on from it).
        if (known_head_ > 0 && !catching_up_ && now_us > catch_up_next_us_) {
          catch_up_next_us_ = now_us + 2'000'000;
          Send(out, root_conn_, CatchUpRequest{opt_.seed_version, known_head_});
          catching_up_ = true;
          catch_up_deadline_us_ = now_us + 10'000'000;
          catch_up = true;
        }
      } else if ((need_catch_up_check_ || now_us > catch_up_next_us_) && !catching_up_ &&
                 !opt_.relay_only && KnownHeadLocked() > PosLocked()) {
        catch_up_next_us_ = now_us + 2'000'000;
        // The tree brings HEAD when we serve HEAD's parent (HEAD-1 within
        // an epoch; a supersede's parent is the withdrawn HEAD), or hold the
        // patches that lead there; anything older is caught up from the board.
        uint64_t reach = store_version_;
        for (auto& [v, o] : ready_)
          if (o.first.from == reach || o.first.kind == ObjectKind::kKeyframe) reach = v;
        auto head = manifests_.find(known_head_);
        const bool near = head != manifests_.end()
                              ? reach == known_head_ || head->second.parent == reach
                              : PosOfLocked(reach).epoch == known_head_epoch_ &&
                                    reach + 1 >= known_head_;
        if (!near) {
          Send(out, root_conn_, CatchUpRequest{store_version_, known_head_});
          catching_up_ = true;
          catch_up_deadline_us_ = now_us + 60'000'000;
          catch_up = true;
        }
      }
      need_catch_up_check_ = false;
      MemberWatchParentsLocked(out, figures.links);
    }
    // Not while the root is away: a failed parent would be redialled on
    // every tick (it is often the root itself, dead), and the root we join
    // next sends PARENTS anyway.
    if (joined_ && relay_ && !parents_.parents.empty() &&
        parent_redial_.size() == parents_.parents.size()) {
      const uint64_t now_us = clock_.NowUs();
      for (size_t s = 0; s < parent_redial_.size(); ++s)
        if (TakeParentRedial(parent_redial_[s], now_us)) redial.push_back(parents_.parents[s]);
      if (!redial.empty()) {
        stripes = static_cast<uint32_t>(parents_.parents.size());
        relay = relay_.get();
        relay->SetServedVersion(VersionLocked());  // in the SUBSCRIBE of these dials
      }
    }
  }
  (void)catch_up;
  Flush(out);
  if (cut_off) {
    // As if it had closed (a silent link may never say so), then closed.
    MemberOnClosed(cut_off, Status(Code::kTimeout, "no valid HEAD beacon for " +
                                                       std::to_string(opt_.stale_after_ms) + " ms"));
    cut_off->Close();
  }
  if (!note.empty()) Log(note);
  if (prepare_spare) Post([this] { MemberPrepareSpare(); });
  if (retry_apply) Post([this] { MemberTryApply(); });
  MemberProbeParents();
  for (const auto& p : redial) relay->SetParent(p.stripe, stripes, p.data_address, TransportOf(p));
}

}  // namespace tern::agent
