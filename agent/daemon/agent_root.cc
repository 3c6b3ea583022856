// The root agent: the board, the signing key, membership and planning,
// publishing and the catch-up service (agent/daemon/agent_impl.h).
#include <algorithm>
#include <cstdio>
#include <utility>

#include "agent/board/model_files.h"
#include "agent/board/publish.h"
#include "agent/daemon/agent_impl.h"
#include "tern/key_set.h"
#include "agent/daemon/key_sets_file.h"
#include "agent/daemon/publish_tensors.h"
#include "base/text.h"
#include "tern/checkpoint.h"

namespace tern::agent {
namespace {

// "prepare 0.012, verify_prev 0.030, ...": the publish log line's stages.
std::string PublishSpansText(const AgentPublishSpans& s) {
  std::string text;
  for (const PublishSpanField& f : kPublishSpanFields) {
    if (!f.stage) continue;
    if (!text.empty()) text += ", ";
    char figure[32];
    std::snprintf(figure, sizeof figure, "%s %.3f", f.name, s.*f.seconds);
    text += figure;
  }
  return text;
}

}  // namespace

EtcdOptions AgentImpl::BoardEtcdOptions(const EtcdBoardUrl& url) const {
  EtcdOptions etcd;
  etcd.endpoints = url.endpoints;
  etcd.ca_pem = opt_.etcd_ca_pem;
  etcd.cert_pem = opt_.etcd_cert_pem;
  etcd.key_pem = opt_.etcd_key_pem;
  etcd.user = opt_.etcd_user;
  etcd.password = opt_.etcd_password;
  etcd.insecure = opt_.etcd_insecure;
  etcd.log = log_;
  return etcd;
}

Status AgentImpl::CampaignForRoot() {
  TERN_ASSIGN_OR_RETURN(EtcdBoardUrl url, ParseEtcdBoardUrl(opt_.board_etcd));
  const EtcdOptions etcd = BoardEtcdOptions(url);
  ElectionOptions eo;
  eo.prefix = url.prefix;
  eo.id = opt_.id.empty() ? opt_.listen : opt_.id;
  eo.lease_ttl_s = opt_.etcd_lease_s;
  eo.log = log_;
  eo.on_lost = [this](const Status& why) {
    leadership_lost_ = true;
    Log("lost leadership of the board (" + why.ToString() + "); refusing to publish");
  };
  log_("agent: campaigning for the board at " + opt_.board_etcd + " (a standby waits here)");
  TERN_ASSIGN_OR_RETURN(election_, Election::Campaign(etcd, eo, clock_, uint64_t{365} * 24 * 3600 * 1000));
  log_("agent: leading the board at " + opt_.board_etcd);
  return Status::Ok();
}

std::shared_ptr<const ManifestSigner> AgentImpl::Signer() const {
  MutexLock lock(signer_mu_);
  return signer_;
}

// The chain after key set 0: first what this root applied before
// (DIR/key-sets: earlier --key-set flags and POST /keys/rotate), then, with
// a board in etcd, what the board holds beyond that (a standby taking over
// learns what its predecessor applied), then the --key-set flags it does
// not hold yet. A key set repeating one it holds must be that key set byte
// for byte (two different key sets of one number are a fork of the chain:
// refused). Each is verified against the set before it as it is applied.
Result<AgentImpl::RootKeyChain> AgentImpl::CollectRootKeySets(ManifestVerifier& v) {
  RootKeyChain chain;
  auto apply = [&](const std::string& entry, const std::string& from) -> Status {
    auto ks = ApplyKeySet(v, entry);
    if (!ks.ok()) return Status(ks.status().code(), "agent: " + from + ": " + ks.status().message());
    chain.sets.push_back(entry);
    chain.decoded.push_back(std::move(ks).value());
    return Status::Ok();
  };
  // One already held under its number must be that one, byte for byte.
  auto same = [&](size_t seq, const std::string& entry, const std::string& from) -> Status {
    TERN_REQUIRE(chain.sets[seq - 1] == entry, kMismatch, "agent: ", from, " is key set ", seq,
                 ", which differs from the key set ", seq, " held before it: two key sets of one number");
    return Status::Ok();
  };
  const std::string path = opt_.data_dir + "/key-sets";
  TERN_ASSIGN_OR_RETURN(KeySetsFile stored, ReadKeySetsFile(env_, path));
  if (!stored.rest.ok())
    return Status(stored.rest.code(), "agent: " + stored.rest.message() +
                                          " (restore it, or move it away and give the chain with --key-set)");
  for (size_t i = 0; i < stored.key_sets.size(); ++i)
    TERN_RETURN_IF_ERROR(apply(stored.key_sets[i], "key set #" + std::to_string(i + 1) + " of " + path));
  chain.in_dir = chain.sets.size();
  if (board_key_sets_) {
    auto board_chain = board_key_sets_->Load();
    if (!board_chain.ok()) return board_chain.status().WithContext("agent: the board's key sets in etcd");
    chain.on_board = board_chain->size();
    for (size_t i = 0; i < board_chain->size(); ++i) {
      const std::string from = "key set " + std::to_string(i + 1) + " of the board in etcd";
      if (i < chain.sets.size()) {
        TERN_RETURN_IF_ERROR(same(i + 1, (*board_chain)[i], from));
      } else {
        TERN_RETURN_IF_ERROR(apply((*board_chain)[i], from));
      }
    }
  }
  for (size_t i = 0; i < opt_.key_sets.size(); ++i) {
    const std::string& flag = opt_.key_sets[i];
    const std::string from = "key set #" + std::to_string(i + 1) + " of --key-set";
    auto seen = VerifyKeySet(v, flag);
    if (seen.ok() && seen->seq >= 1 && seen->seq <= chain.sets.size()) {
      TERN_RETURN_IF_ERROR(same(seen->seq, flag, from));
      continue;
    }
    TERN_RETURN_IF_ERROR(apply(flag, from));
  }
  return chain;
}

Status AgentImpl::ApplyRootKeySets(const RootKeyChain& chain) {
  for (size_t i = 0; i < chain.sets.size(); ++i) {
    auto ks = ApplyKeySet(verifier_, chain.sets[i]);
    if (!ks.ok()) return Status(ks.status().code(), "agent: key set " + std::to_string(i + 1) + ": " + ks.status().message());
    const char* from = i < chain.in_dir ? " from DIR/key-sets" : i < chain.on_board ? " from the board in etcd" : "";
    Log("key set " + std::to_string(ks->seq) + from + ": " + std::to_string(ks->keys.size()) + " keys, " +
        std::to_string(ks->revoked.size()) + " revoked");
  }
  const auto signer = Signer();
  TERN_REQUIRE(verifier_.Trusts(signer->key_id()), kInvalidArgument,
               "agent: the signing key (key id ", KeyIdHex(signer->key_id()),
               ") is not an active, unexpired key of key set ", verifier_.key_set_seq(),
               ": sign with a key the last key set lists");
  if (chain.sets.size() > chain.in_dir)
    TERN_RETURN_IF_ERROR(WriteKeySetsFile(env_, opt_.data_dir + "/key-sets", chain.sets));
  if (board_key_sets_)
    for (size_t i = chain.on_board; i < chain.sets.size(); ++i) {
      Status s = board_key_sets_->Put(i + 1, chain.sets[i]);
      if (!s.ok()) return s.WithContext("agent: keeping key set " + std::to_string(i + 1) + " on the board in etcd");
    }
  MutexLock lock(mu_);
  root_key_sets_ = chain.sets;
  return Status::Ok();
}

Status AgentImpl::InitRoot() {
  // The signing key: given, or the one kept in DIR, or a new one kept there.
  const std::string key_path = opt_.data_dir + "/signing-key.pem";
  std::string pem = opt_.signing_key_pem;
  if (pem.empty()) {
    TERN_ASSIGN_OR_RETURN(FileType type, env_.TypeOf(key_path, true));
    if (type == FileType::kRegular) {
      TERN_RETURN_IF_ERROR(ReadFileToString(env_, key_path, 64 << 10, &pem));
    } else {
      TERN_ASSIGN_OR_RETURN(ManifestSigner fresh, ManifestSigner::Generate());
      TERN_ASSIGN_OR_RETURN(pem, fresh.PrivateKeyPem());
      // Owner-only from its creation: the key is never readable by others.
      TERN_RETURN_IF_ERROR(WriteFileAtomic(
          env_, key_path, {reinterpret_cast<const uint8_t*>(pem.data()), pem.size()},
          /*overwrite=*/false, CreateMode::kNewOwnerOnly));
      Log("generated a signing key in " + key_path);
    }
  }
  TERN_ASSIGN_OR_RETURN(ManifestSigner signer, ManifestSigner::FromPem(pem));
  {
    MutexLock lock(signer_mu_);
    signer_ = std::make_shared<const ManifestSigner>(std::move(signer));
  }
  // Key set 0 is the configured keys and the root's own (it may be both;
  // the board's history was signed by keys of set 0 or by this key). Once
  // this root has rotated (RotateKeys), the key it held at its first start
  // is kept in DIR/key-set-0.pub and belongs to set 0 too: it signed the
  // history before the rotation and the first key set. The key set that
  // follows replaces set 0's keys (ApplyRootKeySets checks this key).
  const auto signer_now = Signer();
  const std::string key0_path = opt_.data_dir + "/key-set-0.pub";
  TERN_ASSIGN_OR_RETURN(FileType key0_type, env_.TypeOf(key0_path, true));
  // chain_verifier: the same key set 0, to walk the chain on before the
  // board is opened (below).
  ManifestVerifier chain_verifier;
  chain_verifier.SetWallClock([this] { return WallUnixMs(); });
  for (const auto& pem : opt_.trusted_keys_pem) TERN_RETURN_IF_ERROR(chain_verifier.AddTrustedKeyPem(pem));
  auto trust_in_set0 = [&](const std::array<uint8_t, 32>& key) -> Status {
    for (ManifestVerifier* v : {&verifier_, &chain_verifier})
      if (!v->Trusts(KeyIdOf(key))) TERN_RETURN_IF_ERROR(v->AddTrustedKey(key));
    return Status::Ok();
  };
  if (key0_type == FileType::kRegular) {
    std::string key0_pem;
    TERN_RETURN_IF_ERROR(ReadFileToString(env_, key0_path, 64 << 10, &key0_pem));
    auto key0 = Ed25519PublicKeyFromPem(key0_pem);
    if (!key0.ok()) return Status(key0.status().code(), "agent: " + key0_path + ": " + key0.status().message());
    TERN_RETURN_IF_ERROR(trust_in_set0(*key0));
  }
  if (!verifier_.Trusts(signer_now->key_id()) && key0_type != FileType::kRegular) root_key0_ = signer_now;
  TERN_RETURN_IF_ERROR(trust_in_set0(signer_now->public_key()));

  std::unique_ptr<BoardLog> log;
  if (election_) {
    TERN_ASSIGN_OR_RETURN(EtcdBoardUrl url, ParseEtcdBoardUrl(opt_.board_etcd));
    const EtcdOptions etcd = BoardEtcdOptions(url);
    EtcdBoardLogOptions lo;
    lo.prefix = url.prefix + "/board";
    lo.fence = election_->Fence();  // a deposed root's late write fails in etcd
    TERN_ASSIGN_OR_RETURN(auto etcd_log, EtcdBoardLog::Open(etcd, lo));
    log = std::move(etcd_log);
    EtcdKeySetsOptions ko;
    ko.prefix = lo.prefix;
    ko.fence = lo.fence;
    ko.max_key_sets = kMaxControlKeySets;
    ko.max_key_set_bytes = kMaxSignedKeySetBytes;
    TERN_ASSIGN_OR_RETURN(board_key_sets_, EtcdKeySets::Open(etcd, ko));
  } else {
    TERN_ASSIGN_OR_RETURN(log, OpenFileBoardLog(env_, opt_.data_dir + "/board"));
  }
  // The board's history was signed by keys of set 0 and by keys the chain
  // listed later (a standby taking over after a rotation signs with such a
  // key and reads what its predecessor signed): the chain is walked on
  // chain_verifier, each set verified against the one before, and the keys
  // it lists are trusted for the history. What comes after the board is
  // open is judged by the last set alone (ApplyRootKeySets, below).
  TERN_ASSIGN_OR_RETURN(RootKeyChain chain, CollectRootKeySets(chain_verifier));
  for (const KeySet& ks : chain.decoded)
    for (const TrustedKey& k : ks.keys)
      if (!verifier_.Trusts(KeyIdOf(k.public_key))) TERN_RETURN_IF_ERROR(verifier_.AddTrustedKey(k.public_key));

  BoardOptions board_options;
  board_options.keep_patches = opt_.keep_patches;
  board_options.keyframe_every = opt_.keyframe_every;
  TERN_RETURN_IF_ERROR(CreateDirs(env_, published_dir_));
  TERN_ASSIGN_OR_RETURN(board_, Board::Open(env_, published_dir_, std::move(log), verifier_,
                                            board_options, log_));
  TERN_RETURN_IF_ERROR(ApplyRootKeySets(chain));
  if (board_->head() != store_->version())
    Log("board HEAD " + std::to_string(board_->head()) + " but DIR/current serves " +
        std::to_string(store_->version()));

  MemberInfo root_info;
  root_info.id = id_;
  root_info.region = opt_.region;
  root_info.cluster = opt_.cluster;
  root_info.island = opt_.island;
  root_info.data_address = listen_address_;
  root_info.intra_address = intra_address_;
  if (!intra_address_.empty()) root_info.intra_backend = opt_.intra_transport->name();
  root_info.uplink_bytes_per_s = opt_.uplink_bytes_per_s;
  root_info.downlink_bytes_per_s = opt_.downlink_bytes_per_s;
  topology::PlanOptions plan;
  plan.fanout_max = opt_.fanout_max;
  plan.root_fanout_max = opt_.root_fanout_max;
  plan.stripes = opt_.stripes;
  ProbationOptions probation;
  probation.quiet_us = uint64_t{opt_.relay_probation_ms} * 1000;
  {
    MutexLock lock(mu_);
    membership_ = std::make_unique<Membership>(root_info, plan, uint64_t{opt_.dead_after_ms} * 1000,
                                               probation, uint64_t{opt_.parent_stall_ms} * 1000);
    FormatChoiceOptions format;
    format.forced_format = opt_.patch_format;
    format_chooser_.emplace(format);
    // A standby that takes over has a larger leader revision than the root
    // it replaces; a lone root's next start a later wall time.
    beacon_incarnation_ = election_ ? static_cast<uint64_t>(election_->created_revision()) : WallUnixMs();
    TERN_RETURN_IF_ERROR(MakeRelay(board_->id(), RelayCallbacks{}));
  }
  // Re-offer what the board holds, so a restarted root feeds its trees again.
  for (uint64_t v : board_->Versions()) {
    for (const auto& signed_manifest : board_->SignedManifests(v)) {
      auto m = verifier_.Verify(signed_manifest);
      if (!m.ok()) continue;
      for (const auto& o : m->objects) {
        const ObjectRef ref{o.kind, o.from_version, o.to_version};
        if (!board_->HasObject(ref)) continue;
        if (v + std::min<uint64_t>(opt_.keep_patches, 32) <= board_->head()) continue;
        Status s = relay_->Offer(signed_manifest, ref, board_->ObjectPath(ref));
        if (!s.ok()) Log("not re-offering " + ObjectName(ref) + ": " + s.ToString());
        MutexLock lock(mu_);
        relay_held_.insert(ref);
      }
    }
  }

  // Catch-up objects are served by the file service (resumable, sandboxed
  // to the objects directory), on the agent's host and any free port.
  FileServerOptions fs;
  fs.log = log_;
  fs.access_token = opt_.join_token;  // a member presents it with every GET
  const std::string host = listen_address_.substr(0, listen_address_.rfind(':'));
  TERN_ASSIGN_OR_RETURN(fetch_server_, FileServer::Start(*opt_.transport, host + ":0", published_dir_,
                                                         fs, clock_));
  return Status::Ok();
}

void AgentImpl::RootNotifyParents(const std::vector<std::string>& ids, Outbox& out) {
  for (const auto& id : ids) {
    auto conn = member_conns_.find(id);
    if (conn == member_conns_.end()) continue;
    std::vector<std::string> notes;
    auto parents = membership_->ParentsOf(id, &notes);
    for (const auto& note : notes) Log(note);
    if (!parents.ok()) {
      Log("no parents for " + id + ": " + parents.status().ToString());
      continue;
    }
    membership_->MarkSent(id, parents->epoch);
    Send(out, conn->second, *parents);
  }
}

void AgentImpl::RootOnControl(const std::shared_ptr<Connection>& conn, std::string* member_id,
                              ControlMessage msg) {
  Outbox out;
  bool close = false;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    if (member_id->empty()) {
      auto* hello = std::get_if<Hello>(&msg);
      std::string why;
      if (!started_) {
        why = "the root is starting";
      } else if (leadership_lost_) {
        why = "this root no longer leads the board";
      } else if (!hello) {
        why = std::string("expected HELLO, got ") + ControlTypeName(TypeOf(msg));
      } else if (!opt_.join_token.empty() && !SecretEquals(opt_.join_token, hello->join_token)) {
        why = "bad join token";
      } else if (hello->board_id != BoardId{} && hello->board_id != board_->id()) {
        why = "member belongs to another board";
      } else if (auto r = removed_until_us_.find(hello->member.id);
                 r != removed_until_us_.end() && clock_.NowUs() < r->second) {
        why = "member " + hello->member.id + " was removed by an operator; it may rejoin in " +
              std::to_string((r->second - clock_.NowUs()) / 1000) + " ms";
      } else if (hello->served_version > board_->head() && !board_->PosOf(hello->served_version).ok()) {
        // Above HEAD's number is fine for a version the log holds: one a
        // supersede withdrew (docs/agent/board.md §4a); catch-up plans from
        // its position. Any other number was never published here.
        why = "member serves version " + std::to_string(hello->served_version) +
              ", newer than this board's HEAD " + std::to_string(board_->head()) +
              " and not in its log";
      } else {
        std::vector<std::string> notify;
        Status s = membership_->Join(hello->member, hello->served_version, clock_.NowUs(), &notify);
        if (!s.ok()) {
          why = s.message();
        } else {
          *member_id = hello->member.id;
          member_conns_[*member_id] = conn;
          Welcome w;
          w.board_id = board_->id();
          w.head = board_->head();
          w.heartbeat_ms = opt_.heartbeat_ms;
          w.stripes = opt_.stripes;
          w.parent_stall_ms = opt_.parent_stall_ms;
          w.fetch_address = fetch_server_ ? fetch_server_->address() : "";
          Send(out, conn, w);
          // Before any HEAD or catch-up: the member verifies those with the
          // keys this chain leads to.
          if (!root_key_sets_.empty()) Send(out, conn, KeySets{root_key_sets_});
          // HEAD's signed manifest: its epoch, which WELCOME does not carry
          // (after a supersede HEAD's number may be below the member's).
          if (board_->head() != 0) {
            const std::vector<std::string> head = board_->SignedManifests(board_->head());
            if (!head.empty()) Send(out, conn, Head{board_->head(), head.front()});
          }
          next_beacon_us_ = 0;  // its first beacon at the next tick, in sequence
          RootNotifyParents(notify, out);
          EmitMember(AgentEvent::Kind::kMemberJoined, *member_id);
          Log("joined " + *member_id + " (" + hello->member.region + "/" + hello->member.cluster +
              ") from " + conn->peer_address() + " serving " + std::to_string(hello->served_version));
        }
      }
      if (!why.empty()) {
        Log("refused a join from " + conn->peer_address() + ": " + why);
        Send(out, conn, Reject{why});
        close = true;
      }
    } else if (auto* hb = std::get_if<Heartbeat>(&msg)) {
      if (membership_->Heartbeat(*member_id, *hb, clock_.NowUs()).ok()) {
        const double now = NowS();
        // Served by position: a member on a withdrawn number (above a
        // supersede's) has not served the versions below it.
        const auto served_pos = board_->PosOf(hb->served_version);
        for (auto it = waiting_.begin(); it != waiting_.end() && it->first <= hb->served_version;) {
          if (auto pos = board_->PosOf(it->first);
              served_pos.ok() && pos.ok() && *pos > *served_pos) {
            ++it;
            continue;
          }
          auto& vs = versions_[it->first];
          if (it->second.erase(*member_id) && vs.first_served_s < 0) vs.first_served_s = now - vs.published_at_s;
          if (it->second.empty()) {
            vs.last_served_s = now - vs.published_at_s;
            it = waiting_.erase(it);
          } else {
            ++it;
          }
        }
      }
    } else if (auto* req = std::get_if<CatchUpRequest>(&msg)) {
      const std::string id = *member_id;
      const CatchUpRequest r = *req;
      std::weak_ptr<Connection> weak = conn;
      // mu_ is held: queue directly (Post would take it again).
      work_.push_back([this, id, r, weak] {
        // Squashes are made on the publisher's lock: one writer on the board
        // and on the pool at a time.
        MutexLock publish_lock(publish_mu_);
        PublishOptions po;
        po.segment_elements = opt_.segment_elements;
        po.nibble_coding = opt_.patch_nibbles;
        CatchUpReply reply;
        reply.target = r.target;
        if (r.have > 0) {
          // have's own publication manifest first: a member that holds a
          // checkpoint of `have` checks it against its target digest.
          // Retention may have dropped it: only the manifest-only request
          // (target == have) needs it.
          auto own = board_->SignedManifests(r.have);
          if (!own.empty()) {
            reply.signed_manifests.push_back(own.front());
          } else if (r.target == r.have) {
            Log("no manifest of version " + std::to_string(r.have) + " for " + id + ": not on the board");
            return;
          }
        }
        // By position, not number: after a supersede the target's number
        // may be below have's (PlanCatchUp refuses a member ahead).
        if (r.target != r.have) {
          auto plan = board_->PlanCatchUp(r.have, r.target, [&](uint64_t from, uint64_t to) {
            return MakeSquash(*board_, *Signer(), from, to, po, pool_).status();
          });
          if (!plan.ok()) {
            Log("no catch-up for " + id + " from " + std::to_string(r.have) + ": " + plan.status().ToString());
            return;
          }
          if (plan->objects.empty()) return;  // nothing to do: the member is there
          for (auto& m : plan->signed_manifests)
            if (reply.signed_manifests.empty() || m != reply.signed_manifests.front())
              reply.signed_manifests.push_back(std::move(m));
          reply.objects = std::move(plan->objects);
        }
        // A route of 64 manifests leaves no room for have's: a member
        // that was not checking a checkpoint does not need it.
        if (reply.signed_manifests.size() > kMaxControlManifests && !reply.objects.empty())
          reply.signed_manifests.erase(reply.signed_manifests.begin());
        auto c = weak.lock();
        if (!c) return;
        Outbox out;
        Send(out, c, reply);
        Flush(out);
      });
      work_cv_.Signal();
    } else if (auto* ping = std::get_if<Ping>(&msg)) {
      Send(out, conn, Pong{ping->nonce});
    } else if (auto* report = std::get_if<ParentReport>(&msg)) {
      std::vector<std::string> notify;
      auto demoted = [&]() REQUIRES(mu_) {
        auto it = membership_->members().find(report->parent_id);
        return it != membership_->members().end() && it->second.demoted;
      };
      const bool was_demoted = demoted();
      Status s = membership_->ReportParent(*member_id, *report, clock_.NowUs(), &notify);
      if (s.ok() && !was_demoted && demoted())
        EmitMember(AgentEvent::Kind::kMemberDemoted, report->parent_id);
      if (s.ok()) {
        RootNotifyParents(notify, out);
        Log(*member_id + " reported its parent " + report->parent_id + " in stripe " +
            std::to_string(report->stripe) + " (" + ParentFaultName(report->fault) +
            "); planned around it, moved " + std::to_string(notify.size()) + " member(s); " +
            report->parent_id + ": " +
            membership_->StallEvidence(report->parent_id, clock_.NowUs()));
      } else {
        Log("ignoring " + *member_id + "'s report on " + report->parent_id + " (" +
            ParentFaultName(report->fault) + "): " + s.message());
        // A report on a parent the plan no longer gives it: the member
        // missed its newest PARENTS. Send them again (as often as it
        // reports: its stall timer bounds the rate).
        const topology::Plan& plan = membership_->plan();
        if (report->stripe < plan.parent.size()) {
          auto it = plan.parent[report->stripe].find(*member_id);
          if (it != plan.parent[report->stripe].end() && it->second != report->parent_id)
            RootNotifyParents({*member_id}, out);
        }
      }
    } else if (std::holds_alternative<Leave>(msg)) {
      std::vector<std::string> notify;
      membership_->Leave(*member_id, &notify);
      member_conns_.erase(*member_id);
      for (auto& [v, ids] : waiting_) ids.erase(*member_id);
      RootNotifyParents(notify, out);
      EmitMember(AgentEvent::Kind::kMemberLeft, *member_id);
      Log("member " + *member_id + " left");
      member_id->clear();
      close = true;
    } else {
      Log("closing " + *member_id + ": unexpected " + ControlTypeName(TypeOf(msg)));
      close = true;
    }
  }
  Flush(out);
  if (close) conn->Close();
}

void AgentImpl::RootOnClosed(const std::string& member_id, const std::shared_ptr<Connection>& conn) {
  Outbox out;
  {
    MutexLock lock(mu_);
    auto it = member_conns_.find(member_id);
    if (it == member_conns_.end() || (conn && it->second != conn)) return;
    member_conns_.erase(it);
    std::vector<std::string> notify;
    membership_->Leave(member_id, &notify);
    for (auto& [v, ids] : waiting_) ids.erase(member_id);
    RootNotifyParents(notify, out);
    EmitMember(AgentEvent::Kind::kMemberFailed, member_id);
    Log("member " + member_id + " disconnected; re-planned " + std::to_string(notify.size()) +
        " member(s)");
  }
  Flush(out);
}

void AgentImpl::RootTick() {
  std::vector<std::shared_ptr<Connection>> silent;
  Outbox out;
  {
    MutexLock lock(mu_);
    for (const auto& id : membership_->Silent(clock_.NowUs())) {
      auto it = member_conns_.find(id);
      if (it != member_conns_.end()) {
        silent.push_back(it->second);
        member_conns_.erase(it);
      }
      // Dropped here, not in on_closed: a connection that already closed
      // (its on_closed raced the join) says nothing more.
      std::vector<std::string> notify;
      membership_->Leave(id, &notify);
      for (auto& [v, ids] : waiting_) ids.erase(id);
      RootNotifyParents(notify, out);
      EmitMember(AgentEvent::Kind::kMemberFailed, id);
      Log("member " + id + " silent for " + std::to_string(opt_.dead_after_ms) + " ms; dropped it");
    }
    for (const auto& id : membership_->EndProbations(clock_.NowUs())) {
      const RelayProbation& p = membership_->members().at(id).probation;
      Log("member " + id + " may relay again: no report on it for " +
          std::to_string((p.promoted_us - std::min(p.promoted_us, p.demoted_us)) / 1000) +
          " ms since it was demoted (" + ParentFaultName(p.last_fault) + ", demotion " +
          std::to_string(p.strikes) + ")");
    }
  }
  Flush(out);
  for (auto& c : silent) c->Close();
  RootBeaconTick();
}

Status AgentImpl::Publish(const std::string& checkpoint_path, uint64_t version) {
  TERN_REQUIRE(opt_.root, kInvalidArgument, "publish: this agent is not the root");
  TERN_REQUIRE(!leadership_lost_, kUnavailable, "publish: this root no longer leads the board");
  // From the call: a squash for catch-up or the last publish's tail may
  // hold the publisher's lock (the spans' prepare_s counts the wait).
  const double t0 = NowS();
  MutexLock publish_lock(publish_mu_);
  return PublishLocked(t0, checkpoint_path, version);
}

Status AgentImpl::Supersede(const std::string& checkpoint_path, uint64_t version) {
  TERN_REQUIRE(opt_.root, kInvalidArgument, "supersede: this agent is not the root");
  TERN_REQUIRE(!leadership_lost_, kUnavailable, "supersede: this root no longer leads the board");
  const double t0 = NowS();
  MutexLock publish_lock(publish_mu_);
  return PublishLocked(t0, checkpoint_path, version, /*supersede=*/true);
}

Status AgentImpl::AdmitSupersede(uint64_t version) const {
  const BoardPos head = board_->head_pos();
  TERN_REQUIRE(head.version != 0, kInvalidArgument, "supersede: the board is empty; publish version ",
               version, " without --supersede");
  TERN_REQUIRE(version != 0 && version < head.version, kInvalidArgument, "supersede: version ",
               version, " is not below HEAD ", head.version,
               " (a supersede renumbers downwards; a version above HEAD is an ordinary publish)");
  TERN_REQUIRE(!board_->PosOf(version).ok(), kAlreadyExists, "supersede: version ", version,
               " is in the board's log already (numbers are never used twice while the log holds "
               "them); choose a number the log does not hold");
  return Status::Ok();
}

Status AgentImpl::PublishTensors(uint64_t version, const std::vector<PublishTensor>& tensors) {
  TERN_REQUIRE(opt_.root, kInvalidArgument, "publish_tensors: this agent is not the root");
  TERN_REQUIRE(!leadership_lost_, kUnavailable, "publish_tensors: this root no longer leads the board");
  const double t0 = NowS();  // from the call, as Publish
  MutexLock publish_lock(publish_mu_);
  TERN_REQUIRE(version > board_->head(), kInvalidArgument, "publish_tensors: version ", version,
               " is not newer than HEAD ", board_->head());
  // The previous view is the served slot, mapped (the page cache holds it
  // after the last publish); no checkpoint the trainer wrote is read.
  OpenOptions open;
  open.env = &env_;
  std::unique_ptr<Checkpoint> prev;
  if (store_->version() != 0) {
    TERN_ASSIGN_OR_RETURN(prev, Checkpoint::Open(store_->current_path(), open));
  }
  TERN_ASSIGN_OR_RETURN(auto next, ViewOfTensors(tensors, prev ? &prev->view() : nullptr));
  PublishOptions options;
  options.segment_elements = opt_.segment_elements;
  if (opt_.patch_format != 0) options.format_version = opt_.patch_format;
  options.nibble_coding = opt_.patch_nibbles;
  options.keyframe_only = !prev && board_->head() != 0;
  return PublishViewLocked(t0, version, std::move(prev), next->view, /*next_owner=*/nullptr,
                           /*seed_checkpoint=*/"", options, {});
}

Status AgentImpl::PublishLocked(double t0, const std::string& checkpoint_path, uint64_t version,
                                bool supersede) {
  if (supersede) {
    TERN_RETURN_IF_ERROR(AdmitSupersede(version));
  } else {
    TERN_REQUIRE(version > board_->head(), kInvalidArgument, "publish: version ", version,
                 " is not newer than HEAD ", board_->head(),
                 board_->head() > version + 1 ? " (a wrong HEAD is withdrawn by a supersede: "
                                                "docs/agent/operations.md)"
                                              : "");
  }
  OpenOptions open;
  open.env = &env_;
  TERN_ASSIGN_OR_RETURN(auto next, Checkpoint::Open(checkpoint_path, open));
  // Our own view is a base only when it is HEAD's. A root that led, lost
  // the lead (killed, restarted as a standby) and leads again after another
  // root published holds the view of an older version: diffing from it was
  // refused (prev_digest is not D(HEAD)) on every publish, for good (found
  // by the soak, docs/soak.md). It publishes a keyframe on top of HEAD, like
  // a root that holds no view.
  std::unique_ptr<Checkpoint> prev;
  if (store_->version() != 0 && store_->version() == board_->head() &&
      store_->epoch() == board_->head_pos().epoch) {
    TERN_ASSIGN_OR_RETURN(prev, Checkpoint::Open(store_->current_path(), open));
  }
  PublishOptions options;
  options.segment_elements = opt_.segment_elements;
  if (opt_.patch_format != 0) options.format_version = opt_.patch_format;
  options.nibble_coding = opt_.patch_nibbles;
  // A supersede is the backwards patch(HEAD -> version) from HEAD's view.
  options.supersede = supersede;
  TERN_REQUIRE(!supersede || prev, kUnavailable, "supersede: this root does not serve HEAD ",
               board_->head(), " (it serves ", store_->version(),
               "); a supersede diffs from HEAD's view: publish once from this root first");
  // A root that took over the board does not hold HEAD's view: its first
  // version is a keyframe on top of HEAD (members apply it like any other).
  options.keyframe_only = !prev && board_->head() != 0;
  // After a key set that dropped or revoked HEAD's signing key, members
  // refuse the manifests a new member would start from: this version
  // brings a keyframe signed by the current key.
  if (board_->head() != 0) {
    const std::vector<std::string> signed_head = board_->SignedManifests(board_->head());
    options.with_keyframe = signed_head.empty() || !verifier_.Verify(signed_head[0]).ok();
    if (options.with_keyframe)
      Log("publish: HEAD's manifest is signed by a key no longer trusted; version " +
          std::to_string(version) + " carries a keyframe");
  }
  // The version's model files, stored content-addressed where the object
  // service serves them (published/files/<sha256>) before they are signed.
  const std::string files_dir = published_dir_ + "/files";
  TERN_ASSIGN_OR_RETURN(options.files,
                        StoreModelFiles(env_, checkpoint_path, files_dir,
                                        [this](std::string_view line) { Log(std::string(line)); }));
  std::vector<SlotFile> slot_files;
  for (const ManifestFile& f : options.files)
    slot_files.push_back({f, published_dir_ + "/" + ModelFileObjectName(f.sha256)});
  const ServeView& view = next->view();
  return PublishViewLocked(t0, version, std::move(prev), view, std::move(next), checkpoint_path,
                           options, slot_files);
}

Status AgentImpl::PublishViewLocked(double t0, uint64_t version, std::unique_ptr<Checkpoint> prev,
                                    const ServeView& next, std::unique_ptr<Checkpoint> next_owner,
                                    const std::string& seed_checkpoint, const PublishOptions& options,
                                    const std::vector<SlotFile>& slot_files) {
  const uint64_t view_bytes = next.total_bytes();
  PublishOptions chosen = options;
  FormatChoice choice;
  {
    MutexLock lock(mu_);
    choice = format_chooser_->Choose(membership_->plan(), membership_->members(), view_bytes);
  }
  chosen.format_version = choice.format;
  Log("publishing version " + std::to_string(version) + " as " + choice.reason);
  TERN_ASSIGN_OR_RETURN(PublishResult result,
                        PublishVersion(*board_, *Signer(), prev ? &prev->view() : nullptr,
                                       store_->digest(), next, version, chosen, pool_));
  const double published_s = NowS();
  prev.reset();
  next_owner.reset();
  {
    MutexLock lock(mu_);
    format_chooser_->NotePublished(choice.format, result.patch_bytes);
  }
  Status s = ServeAndAnnounceLocked(t0, published_s, version, result, view_bytes, seed_checkpoint,
                                    slot_files);
  MutexLock lock(mu_);
  if (auto it = versions_.find(version); it != versions_.end()) {
    it->second.patch_format = choice.format;
    it->second.format_reason = choice.reason;
    if (choice.predicted) {
      it->second.predicted_f1_s = choice.f1.seconds;
      it->second.predicted_f2_s = choice.f2.seconds;
    }
  }
  return s;
}

Status AgentImpl::ServeAndAnnounceLocked(double t0, double published_s, uint64_t version,
                                         const PublishResult& result, uint64_t view_bytes,
                                         const std::string& seed_checkpoint,
                                         const std::vector<SlotFile>& slot_files) {
  // PublishVersion / PublishPatch returned: the objects are synced and the
  // version recorded. Offer and announce it first; the root's own apply
  // into DIR/current is no business of the tree's and follows (docs/agent/
  // board.md §4, "The root's publish, in order").
  const double recorded_s = NowS();
  AgentPublishSpans spans;
  const PublishSpans& b = result.spans;
  spans.handoff_s = std::max(0.0, recorded_s - published_s);
  spans.prepare_s = std::max(0.0, published_s - t0 - b.total_s);
  spans.verify_prev_s = b.verify_prev_s;
  spans.diff_s = b.diff_s;
  spans.keyframe_s = b.keyframe_s;
  spans.hash_s = b.hash_s;
  spans.sign_s = b.sign_s;
  spans.write_s = b.write_s;
  spans.record_s = b.record_s;
  std::vector<ObjectRef> refs;
  std::optional<ObjectRef> patch;
  for (const auto& o : result.manifest.objects) {
    refs.push_back({o.kind, o.from_version, o.to_version});
    if (o.kind == ObjectKind::kPatch) patch = refs.back();
  }
  for (const auto& ref : refs) {
    Status s = relay_->Offer(result.signed_manifest, ref, board_->ObjectPath(ref));
    if (!s.ok()) Log("offer of " + ObjectName(ref) + " failed: " + s.ToString());
  }
  Outbox out;
  {
    MutexLock lock(mu_);
    for (const auto& ref : refs) relay_held_.insert(ref);
    AgentVersionStatus vs;
    vs.version = version;
    vs.patch_bytes = result.patch_bytes;
    vs.keyframe_bytes = result.keyframe_bytes;
    vs.view_bytes = view_bytes;
    vs.published_at_s = NowS();
    versions_[version] = vs;
    while (versions_.size() > 1024) versions_.erase(versions_.begin());
    auto& waiting = waiting_[version];
    // Time to serve counts serving members: a relay-only one serves nothing.
    for (const auto& [id, rec] : membership_->members())
      if (!rec.info.relay_only) waiting.insert(id);
    if (waiting.empty()) waiting_.erase(version);
    Head head{version, result.signed_manifest};
    for (const auto& [id, conn] : member_conns_) Send(out, conn, head);
  }
  Flush(out);
  double at_s = NowS();
  spans.announce_s = at_s - recorded_s;
  spans.offered_s = at_s - t0;

  // The root serves what it published (DIR/current), and diffs the next
  // version against it. Should this fail, the version is out all the same
  // (recorded, offered): the next publish, finding DIR/current behind
  // HEAD, makes a keyframe on top of HEAD.
  Status served = ServeOwnLocked(version, result, refs, patch, seed_checkpoint, slot_files);
  spans.apply_s = NowS() - at_s;
  at_s = NowS();
  if (!served.ok()) {
    Log("published and offered version " + std::to_string(version) +
        ", but the root's own apply failed: " + served.ToString());
    return served.WithContext("version " + std::to_string(version) +
                              " is published; serving it on the root");
  }
  {
    MutexLock lock(mu_);
    NoteServedLocked();
  }
  // What changed, for the events: the patch's manifest (none: all of it).
  bool all = !patch.has_value();
  std::vector<std::string> changed;
  if (patch) {
    auto object = env_.Map(board_->ObjectPath(*patch), MapMode::kReadOnly);
    if (object.ok()) changed = ChangedTensors((*object)->bytes(), &all);
    else all = true;
  }
  EmitServed(version, result.manifest.target_digest, all, changed);
  std::set<uint64_t> held;
  std::vector<ObjectRef> old;
  {
    MutexLock lock(mu_);
    // The tree carries the newest versions; older ones are catch-up's.
    old = ForgetOldObjectsLocked(version,
                                 std::max<uint64_t>(2, std::min<uint64_t>(opt_.keep_patches, 32)));
    for (const auto& [id, rec] : membership_->members()) held.insert(rec.served_version);
  }
  ForgetObjects(old);
  // Disk: keep what the retention policy and the members' versions need.
  if (Status s = board_->Retain(held); !s.ok()) Log("retention: " + s.ToString());
  {
    // The model files of the versions the board still holds stay.
    std::set<std::string> keep;
    for (uint64_t v : board_->Versions())
      if (auto m = board_->Manifest(v); m.ok())
        for (const ManifestFile& f : m->files) keep.insert(Hex(f.sha256));
    if (Status s = RetainModelFiles(env_, published_dir_ + "/files", keep); !s.ok())
      Log("retention: " + s.ToString());
  }
  EmitPublished(version, result.manifest.target_digest, all, std::move(changed));
  spans.retain_s = NowS() - at_s;
  spans.total_s = NowS() - t0;
  {
    MutexLock lock(mu_);
    if (auto it = versions_.find(version); it != versions_.end()) it->second.publish = spans;
  }
  Log("published version " + std::to_string(version) + " in " + std::to_string(spans.total_s) +
      " s, offered after " + std::to_string(spans.offered_s) + " s: " + PublishSpansText(spans));
  return Status::Ok();
}

Status AgentImpl::ServeOwnLocked(uint64_t version, const PublishResult& result,
                                 const std::vector<ObjectRef>& refs,
                                 const std::optional<ObjectRef>& patch,
                                 const std::string& seed_checkpoint,
                                 const std::vector<SlotFile>& slot_files) {
  rows_view_.reset();  // GET /view/rows opens the new view when asked
  if ((store_->version() == 0 || !patch) && !seed_checkpoint.empty())
    return store_->Seed(seed_checkpoint, version, result.manifest.target_digest, slot_files,
                        result.manifest.epoch);
  if (store_->version() == 0 || !patch) {
    // From memory: the keyframe just written is the view, checked against
    // the signed target digest as it is installed.
    const auto keyframe = std::find_if(refs.begin(), refs.end(), [](const ObjectRef& r) {
      return r.kind == ObjectKind::kKeyframe;
    });
    TERN_REQUIRE(keyframe != refs.end(), kInternal, "publish: version ", version,
                 " has neither a patch nor a keyframe");
    TERN_ASSIGN_OR_RETURN(auto object, env_.Map(board_->ObjectPath(*keyframe), MapMode::kReadOnly));
    return store_->InstallKeyframe(object->bytes(), version, slot_files, result.manifest.epoch);
  }
  TERN_ASSIGN_OR_RETURN(auto object, env_.Map(board_->ObjectPath(*patch), MapMode::kReadOnly));
  // A supersede's patch runs backwards into the next epoch (§4a).
  return store_->Advance(object->bytes(), slot_files, result.manifest.epoch);
}

}  // namespace tern::agent
