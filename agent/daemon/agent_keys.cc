// Key rotation while the root runs (include/tern/agent.h: RotateKeys) and
// its admin route, POST /keys/rotate (docs/agent/operations.md "Rotating
// and revoking the publisher key"): the next key set of the chain and, when
// the signing key changes, the new key, applied between publications, kept
// on disk first and sent to every member before anything is signed with
// the new key.
#include <nlohmann/json.hpp>

#include "agent/daemon/agent_impl.h"
#include "agent/daemon/key_sets_file.h"
#include "agent/ops/admin_http.h"
#include "base/text.h"
#include "tern/key_set.h"

namespace tern::agent {
namespace {

// Whether `id` is an active key of `ks` at `now_ms` (listed, not expired).
bool ListsActive(const KeySet& ks, const ManifestKeyId& id, uint64_t now_ms) {
  for (const TrustedKey& k : ks.keys)
    if (KeyIdOf(k.public_key) == id) return k.not_after_unix_ms == 0 || k.not_after_unix_ms > now_ms;
  return false;
}

Status Bytes(Env& env, const std::string& path, std::string_view text, bool overwrite, CreateMode mode) {
  return WriteFileAtomic(env, path, {reinterpret_cast<const uint8_t*>(text.data()), text.size()}, overwrite,
                         mode);
}

}  // namespace

Status AgentImpl::RotateKeys(std::string_view signed_key_set, std::string_view signing_key_pem) {
  TERN_REQUIRE(opt_.root, kInvalidArgument, "keys: this agent is not the root");
  TERN_REQUIRE(!signed_key_set.empty() || !signing_key_pem.empty(), kInvalidArgument,
               "keys: give the next key set, a new signing key, or both");
  TERN_REQUIRE(signed_key_set.size() <= kMaxSignedKeySetBytes, kInvalidArgument, "keys: a key set of ",
               signed_key_set.size(), " bytes (at most ", kMaxSignedKeySetBytes, ")");
  std::shared_ptr<const ManifestSigner> next;
  if (!signing_key_pem.empty()) {
    auto parsed = ManifestSigner::FromPem(signing_key_pem);
    // Never the key's text in an error.
    TERN_REQUIRE(parsed.ok(), kInvalidArgument, "keys: the new signing key is not an Ed25519 private key PEM");
    next = std::make_shared<const ManifestSigner>(std::move(parsed).value());
  }

  MutexLock publish_lock(publish_mu_);  // between publications, never inside one
  TERN_REQUIRE(board_ != nullptr, kUnavailable, "keys: the root has no board yet");
  const std::shared_ptr<const ManifestSigner> current = Signer();
  const ManifestSigner& signer = next ? *next : *current;
  const uint64_t seq = verifier_.key_set_seq();
  std::vector<std::string> chain;
  {
    MutexLock lock(mu_);
    chain = root_key_sets_;
  }
  for (size_t i = 0; i < chain.size(); ++i)
    TERN_REQUIRE(chain[i] != signed_key_set, kAlreadyExists, "keys: key set ", i + 1,
                 " is applied already (the root is at key set ", seq, "); nothing changed");
  std::optional<KeySet> ks;
  if (!signed_key_set.empty()) {
    auto verified = VerifyKeySet(verifier_, signed_key_set);
    if (!verified.ok())
      return Status(verified.status().code(), "keys: the key set is refused: " + verified.status().message());
    TERN_REQUIRE(verified->seq == seq + 1, kMismatch, "keys: this is key set ", verified->seq,
                 "; the root is at key set ", seq, " and takes ", seq + 1, " next; nothing changed");
    TERN_REQUIRE(ListsActive(*verified, signer.key_id(), verifier_.NowUnixMs()), kMismatch,
                 "keys: the signing key (key id ", KeyIdHex(signer.key_id()),
                 ") is not an active, unexpired key of key set ", verified->seq,
                 ": give the new key it lists (signing_key_file); nothing changed");
    ks = std::move(verified).value();
  } else {
    TERN_REQUIRE(verifier_.Trusts(signer.key_id()), kMismatch, "keys: the new signing key (key id ",
                 KeyIdHex(signer.key_id()), ") is not an active, unexpired key of key set ", seq,
                 "; nothing changed");
  }

  // On disk before anything moves, so that a restart comes back to the same
  // keys: the root's own key of set 0 (its old key signed the board's
  // history), the chain, and a key the root keeps in DIR.
  const std::string key0_path = opt_.data_dir + "/key-set-0.pub";
  if (root_key0_) {
    TERN_ASSIGN_OR_RETURN(FileType type, env_.TypeOf(key0_path, true));
    if (type == FileType::kMissing) {
      TERN_ASSIGN_OR_RETURN(std::string pub, root_key0_->PublicKeyPem());
      TERN_RETURN_IF_ERROR(Bytes(env_, key0_path, pub, /*overwrite=*/false, CreateMode::kNew));
    }
  }
  if (ks) {
    chain.emplace_back(signed_key_set);
    TERN_RETURN_IF_ERROR(WriteKeySetsFile(env_, opt_.data_dir + "/key-sets", chain));
    // And beside the board in etcd, so a standby that takes over from here
    // knows it. Refused when this root no longer leads: nothing is sent or
    // signed then (a retry, or this root's next start as leader, writes it).
    if (board_key_sets_) {
      Status s = board_key_sets_->Put(ks->seq, signed_key_set);
      if (!s.ok())
        return Status(s.code(), "keys: key set " + std::to_string(ks->seq) +
                                    " kept in DIR/key-sets but not on the board in etcd, not applied: " +
                                    s.message());
    }
  }
  const bool key_in_dir = opt_.signing_key_pem.empty();
  if (next && key_in_dir)
    TERN_RETURN_IF_ERROR(Bytes(env_, opt_.data_dir + "/signing-key.pem", signing_key_pem,
                               /*overwrite=*/true, CreateMode::kNewOwnerOnly));

  if (ks) {
    auto applied = ApplyKeySet(verifier_, signed_key_set);
    // Checked above under publish_mu_, the only writer: only a key that
    // expired in between gets here.
    if (!applied.ok())
      return Status(applied.status().code(), "keys: key set " + std::to_string(ks->seq) +
                                                 " kept in DIR/key-sets but not applied: " +
                                                 applied.status().message() + " (restart the root)");
  }
  Outbox out;
  {
    MutexLock lock(mu_);
    root_key_sets_ = chain;
    // The chain first, on each member's control connection: what the new
    // key signs (beacons, HEAD) comes after it on the same connection.
    if (!chain.empty())
      for (const auto& [id, conn] : member_conns_) Send(out, conn, KeySets{chain});
  }
  Flush(out);
  if (next) {
    MutexLock lock(signer_mu_);
    signer_ = next;
  }
  Log("keys rotated: key set " + std::to_string(verifier_.key_set_seq()) + ", signing with key id " +
      KeyIdHex(signer.key_id()) +
      (next && !key_in_dir ? " (started with --signing-key: restart with --signing-key set to the new key)"
                           : ""));
  return Status::Ok();
}

std::vector<AdminRoute> AgentImpl::KeyRoutes() {
  std::vector<AdminRoute> routes;
  routes.push_back(
      {"POST", "/keys/rotate",
       [this](const AdminRequest& req) {
         auto bad = [](std::string_view what) {
           return AdminResponse{400, "text/plain", "expected " + std::string(what) + "\n"};
         };
         constexpr std::string_view kShape =
             "{\"key_set_hex\": HEX (the signed key set), \"signing_key_file\": PATH on the root} (either or both)";
         nlohmann::json j = nlohmann::json::parse(req.body, nullptr, false);
         if (!j.is_object()) return bad(kShape);
         for (const auto& [k, v] : j.items())
           if ((k != "key_set_hex" && k != "signing_key_file") || !v.is_string()) return bad(kShape);
         std::string key_set;
         if (j.contains("key_set_hex")) {
           const std::string hex = j["key_set_hex"].get<std::string>();
           if (hex.empty() || hex.size() % 2 != 0 || hex.size() > 2 * kMaxSignedKeySetBytes)
             return bad("key_set_hex: an even number of hex digits, at most 2 per byte of a signed key set");
           key_set.resize(hex.size() / 2);
           if (!ParseHex(hex, {reinterpret_cast<uint8_t*>(key_set.data()), key_set.size()}))
             return bad("key_set_hex: hex digits");
         }
         std::string pem;
         if (j.contains("signing_key_file")) {
           const std::string path = j["signing_key_file"].get<std::string>();
           if (path.empty() || path.size() > 4096 || path[0] != '/')
             return bad("signing_key_file: an absolute path on the root's machine");
           Status s = ReadFileToString(env_, path, 64 << 10, &pem);
           if (!s.ok())
             return AdminResponse{AdminHttpStatusOf(s), "text/plain",
                                  "keys: cannot read signing_key_file: " + s.ToString() + "\n"};
         }
         Status s = RotateKeys(key_set, pem);
         if (!s.ok()) return AdminResponse{AdminHttpStatusOf(s), "text/plain", s.ToString() + "\n"};
         nlohmann::json ok = {{"key_set", verifier_.key_set_seq()},
                              {"signing_key_id", KeyIdHex(Signer()->key_id())}};
         return AdminResponse{200, "application/json", ok.dump() + "\n"};
       },
       /*mutating=*/true});
  return routes;
}

}  // namespace tern::agent
