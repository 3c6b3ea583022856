// tern keys: make and read signed key sets, the records that rotate and
// revoke the keys a board's publisher signs with (agent/keyset/key_set.h;
// procedure: docs/agent/operations.md, "Rotating and revoking the
// publisher key").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tern/agent.h"
#include "tern/key_set.h"
#include "tern/env.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern::cli {
namespace {

constexpr uint64_t kMsPerDay = 86'400'000;
constexpr uint64_t kMaxExpiresDays = 36'500;

struct RotateArgs {
  std::string old_key, out;
  std::vector<std::string> new_keys, revoke;
  uint64_t seq = 1;
  uint64_t expires_days = 0;
};

uint64_t WallUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

Result<std::string> ReadSmall(const std::string& path) {
  std::string bytes;
  TERN_RETURN_IF_ERROR(ReadFileToString(DefaultEnv(), path, 64 << 10, &bytes));
  return bytes;
}

// A key id: 16 hex digits, or the key id of a key PEM file.
Result<ManifestKeyId> ParseKeyId(const std::string& arg) {
  if (arg.size() == 16 && arg.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos) {
    ManifestKeyId id;
    for (size_t i = 0; i < id.size(); ++i)
      id[i] = static_cast<uint8_t>(std::stoul(arg.substr(2 * i, 2), nullptr, 16));
    return id;
  }
  auto pem = ReadSmall(arg);
  TERN_REQUIRE(pem.ok(), kInvalidArgument, "--revoke ", arg,
               ": neither a 16-hex-digit key id nor a readable key PEM (",
               pem.status().message(), ")");
  TERN_ASSIGN_OR_RETURN(auto pub, Ed25519PublicKeyFromPem(*pem));
  return KeyIdOf(pub);
}

std::string Describe(const KeySet& ks) {
  std::string out = "key set " + std::to_string(ks.seq) + "\n";
  for (const TrustedKey& k : ks.keys)
    out += "  key " + KeyIdHex(KeyIdOf(k.public_key)) +
           (k.not_after_unix_ms ? " not after " + std::to_string(k.not_after_unix_ms) + " ms"
                                : " no expiry") +
           "\n";
  for (const ManifestKeyId& id : ks.revoked) out += "  revoked " + KeyIdHex(id) + "\n";
  return out;
}

Status Rotate(const RotateArgs& a) {
  TERN_REQUIRE(a.seq >= 1, kInvalidArgument, "--seq must be >= 1 (key set 0 is the configured keys)");
  TERN_REQUIRE(a.expires_days <= kMaxExpiresDays, kInvalidArgument, "--expires-days above ",
               kMaxExpiresDays);
  TERN_ASSIGN_OR_RETURN(std::string old_pem, ReadSmall(a.old_key));
  TERN_ASSIGN_OR_RETURN(ManifestSigner signer, ManifestSigner::FromPem(old_pem));
  KeySet ks;
  ks.seq = a.seq;
  ks.created_unix_ms = WallUnixMs();
  const uint64_t not_after = a.expires_days ? ks.created_unix_ms + a.expires_days * kMsPerDay : 0;
  for (const std::string& path : a.new_keys) {
    TERN_ASSIGN_OR_RETURN(std::string pem, ReadSmall(path));
    TERN_ASSIGN_OR_RETURN(auto pub, Ed25519PublicKeyFromPem(pem));
    ks.keys.push_back(TrustedKey{pub, not_after});
  }
  for (const std::string& arg : a.revoke) {
    TERN_ASSIGN_OR_RETURN(ManifestKeyId id, ParseKeyId(arg));
    ks.revoked.push_back(id);
  }
  std::sort(ks.keys.begin(), ks.keys.end(),
            [](const TrustedKey& x, const TrustedKey& y) { return x.public_key < y.public_key; });
  std::sort(ks.revoked.begin(), ks.revoked.end());
  ks.revoked.erase(std::unique(ks.revoked.begin(), ks.revoked.end()), ks.revoked.end());
  TERN_ASSIGN_OR_RETURN(std::string signed_bytes, SignKeySet(signer, ks));
  TERN_RETURN_IF_ERROR(WriteFileAtomic(
      DefaultEnv(), a.out,
      {reinterpret_cast<const uint8_t*>(signed_bytes.data()), signed_bytes.size()},
      /*overwrite=*/false));
  std::printf("%ssigned by key id %s -> %s\n", Describe(ks).c_str(),
              KeyIdHex(signer.key_id()).c_str(), a.out.c_str());
  return Status::Ok();
}

Status Show(const std::string& path) {
  TERN_ASSIGN_OR_RETURN(std::string bytes, ReadSmall(path));
  TERN_REQUIRE(bytes.size() > kManifestTrailerBytes && bytes.size() <= kMaxSignedKeySetBytes,
               kCorrupt, path, ": ", bytes.size(), " bytes is not a signed key set");
  TERN_ASSIGN_OR_RETURN(KeySet ks,
                        DecodeKeySet(std::string_view(bytes).substr(
                            0, bytes.size() - kManifestTrailerBytes)));
  ManifestKeyId signer;
  std::copy_n(bytes.data() + bytes.size() - kManifestTrailerBytes, signer.size(), signer.begin());
  // Not verified here: who may sign it depends on the key set before it,
  // which members check when they apply it.
  std::printf("%ssigned by key id %s (signature not checked)\n", Describe(ks).c_str(),
              KeyIdHex(signer).c_str());
  return Status::Ok();
}

Status PrintKeyIds(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    TERN_ASSIGN_OR_RETURN(std::string pem, ReadSmall(path));
    TERN_ASSIGN_OR_RETURN(auto pub, Ed25519PublicKeyFromPem(pem));
    std::printf("%s  %s\n", KeyIdHex(KeyIdOf(pub)).c_str(), path.c_str());
  }
  return Status::Ok();
}

struct PushArgs {
  std::string board, token_file, key_set, signing_key_file;
  AdminTlsArgs tls;
  uint32_t timeout_s = 60;
};

// POST /keys/rotate: the key set from this machine, the new signing key as
// a path the root reads (a private key does not travel).
Status Push(const PushArgs& a) {
  TERN_REQUIRE(!a.key_set.empty() || !a.signing_key_file.empty(), kInvalidArgument,
               "give --key-set FILE, --signing-key-file PATH, or both");
  TERN_REQUIRE(a.signing_key_file.empty() || a.signing_key_file[0] == '/', kInvalidArgument,
               "--signing-key-file: an absolute path on the root's machine");
  std::string key_set;
  if (!a.key_set.empty()) {
    TERN_ASSIGN_OR_RETURN(key_set, ReadSmall(a.key_set));
    TERN_REQUIRE(key_set.size() > kManifestTrailerBytes && key_set.size() <= kMaxSignedKeySetBytes &&
                     DecodeKeySet(std::string_view(key_set).substr(0, key_set.size() - kManifestTrailerBytes))
                         .ok(),
                 kInvalidArgument, "--key-set ", a.key_set, ": not a signed key set (`tern keys show` it)");
  }
  AgentClientOptions o;
  TERN_ASSIGN_OR_RETURN(o.token, ReadSecret(a.token_file, "TERN_ADMIN_TOKEN"));
  TERN_RETURN_IF_ERROR(ReadAdminTls(a.tls, o));
  o.timeout_ms = a.timeout_s * 1000;
  TERN_RETURN_IF_ERROR(RotateKeysAt(a.board, key_set, a.signing_key_file, o));
  std::printf("rotated on %s\n", a.board.c_str());
  return Status::Ok();
}

}  // namespace

void AddKeys(CLI::App& tern, Dispatch& dispatch) {
  CLI::App* keys = tern.add_subcommand("keys", "rotate and revoke the publisher's signing keys");
  keys->require_subcommand(1);

  auto r = std::make_shared<RotateArgs>();
  CLI::App* rotate = keys->add_subcommand("rotate", "make a signed key set (key rotation)");
  rotate->footer(
      "Writes key set SEQ: the keys that sign from now on (--new-key, each expiring after "
      "--expires-days), the key ids revoked for good (--revoke), signed with a key of key set "
      "SEQ-1 (--old-key). Give it to the root with --key-set; docs/agent/operations.md.");
  rotate->add_option("--old-key", r->old_key, "private key PEM of the current key set")->required();
  rotate->add_option("--new-key", r->new_keys, "a key of the new set: public or private key PEM (repeatable)")
      ->required();
  rotate->add_option("--revoke", r->revoke, "a key id (16 hex digits) or key PEM to revoke (repeatable)");
  rotate->add_option("--seq", r->seq, "the new key set's sequence number (the last one's + 1)")
      ->default_val("1");
  rotate->add_option("--expires-days", r->expires_days, "the new keys' lifetime in days (0: no expiry)")
      ->default_val("0");
  rotate->add_option("--out", r->out, "where to write the signed key set (not overwritten)")->required();
  dispatch.On(rotate, {nullptr, [r] { return Rotate(*r); }});

  auto p = std::make_shared<PushArgs>();
  CLI::App* push = keys->add_subcommand("push", "give a running root the next key set and/or its new signing key");
  push->footer(
      "POST /keys/rotate on the root's admin port: no restart. The root checks that its signing key "
      "is an active key of the result, keeps both on disk, sends the key set to every member, then "
      "signs with the new key; the next publish carries a keyframe the new key signed. "
      "docs/agent/operations.md.");
  push->add_option("--board", p->board, "the root's admin [https://]HOST:PORT")->required();
  AddAdminTlsFlags(*push, p->tls, "the root's");
  push->add_option("--token-file", p->token_file, "bearer token file (default: $TERN_ADMIN_TOKEN)");
  push->add_option("--key-set", p->key_set, "the next signed key set (a file from `tern keys rotate`)");
  push->add_option("--signing-key-file", p->signing_key_file,
                   "absolute path ON THE ROOT'S MACHINE of the private key PEM to sign with from now on");
  AddUnsigned(*push, "--timeout-s", p->timeout_s, "wait this long for the root's answer", "60");
  dispatch.On(push, {nullptr, [p] { return Push(*p); }});

  auto show_path = std::make_shared<std::string>();
  CLI::App* show = keys->add_subcommand("show", "print a signed key set");
  show->add_option("KEYSET", *show_path, "a file from `tern keys rotate`")->required();
  dispatch.On(show, {nullptr, [show_path] { return Show(*show_path); }});

  auto id_paths = std::make_shared<std::vector<std::string>>();
  CLI::App* id = keys->add_subcommand("id", "print the key id of key PEM files");
  id->add_option("PEM", *id_paths, "public or private Ed25519 key PEM files")->required();
  dispatch.On(id, {nullptr, [id_paths] { return PrintKeyIds(*id_paths); }});
}

}  // namespace tern::cli
