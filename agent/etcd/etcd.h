// A small etcd v3 client over etcd's JSON gateway (docs/agent/etcd.md), and
// leader election on top of it. etcd holds the root's board when a standby
// root must be able to take over: the log outlives the root that wrote it.
//
// The client speaks HTTP/1.1 + JSON to the gateway's /v3/kv/{put,range,
// deleterange,txn} and /v3/lease/{grant,keepalive,revoke} (etcd >= 3.4; keys
// and values travel base64-encoded), over http or https (TLS: etcd's
// certificate verified against a given CA, optionally our client
// certificate), optionally as an etcd user (a token from
// /v3/auth/authenticate on every request, renewed when etcd says it is
// invalid or expired). Secure by default: Create refuses an endpoint off
// loopback that is plain http or that we would reach without authenticating
// (no client certificate, no user), unless EtcdOptions::insecure.
//
// Errors (never exceptions):
//  * kUnavailable: no connection, a timeout, or etcd said it cannot serve now
//    (no leader, too many requests). The request may or may not have been
//    applied: writes must be made safe to retry by the caller (a txn that
//    compares first, as EtcdBoardLog and Election do).
//  * kNotFound: an unknown or expired lease.
//  * kInvalidArgument: an empty key, a key or value over the bounds below, a
//    TTL out of range (checked before anything is sent); from Create, bad
//    TLS material or an insecure endpoint (the message says which and why).
//  * kAuth: etcd refused who we are: its certificate does not verify
//    against our CA or name the host, it wants a client certificate we did
//    not give, the user or password is wrong, the user may not touch the
//    key, or etcd wants a user and we gave none. The message names which.
//    Never contains the password or the token.
//  * kProtocol: the peer is not an etcd gateway (non-JSON body, HTTP status
//    other than 200 without an etcd error, a body over max_response_bytes,
//    fields of the wrong type, bad base64). The message quotes the peer only
//    through Printable().
//  * other etcd errors map by their gRPC code (docs/agent/etcd.md).
// Every request has one deadline (timeout_ms) for connect, write and read.
//
// Thread safety: an EtcdClient may be used from many threads at once; its
// requests are serialized on one keep-alive connection. An Election runs
// one keep-alive thread of its own (its own connection) and calls on_lost
// from it; IsLeader/Fence may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tern/clock.h"
#include "tern/log.h"
#include "tern/status.h"

namespace tern::agent {

inline constexpr size_t kEtcdMaxKeyBytes = 4096;
// etcd refuses requests over 1.5 MiB by default (--max-request-bytes).
inline constexpr size_t kEtcdMaxValueBytes = size_t{1} << 20;
inline constexpr int64_t kEtcdMaxLeaseTtlS = 9'000'000'000;  // etcd's own bound

struct EtcdOptions {
  // "host:port" or "http://host:port" (plain), "https://host:port" (TLS);
  // tried in turn: after a connection failure the next call goes to the
  // next endpoint.
  std::vector<std::string> endpoints;
  // TLS, for https endpoints: PEM text (the caller reads the files, bounded;
  // each at most 64 KiB). ca_pem: the CA certificate(s) etcd's certificate
  // must chain to, and only those (empty: the system's trust store).
  // cert_pem + key_pem: our client certificate and its unencrypted key, for
  // etcd's --client-cert-auth (both or neither). Given with an http
  // endpoint: refused (kInvalidArgument).
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // An etcd user (etcd's auth enabled): the client authenticates with
  // user + password and sends the token with every request. Both or
  // neither; the password is never logged nor put in a message.
  std::string user;
  std::string password;
  // Allow an endpoint off loopback over plain http, or without any
  // authentication (no client certificate, no user): whoever reaches etcd
  // could then rewrite the board or hold the leader key. Loopback endpoints
  // are always allowed (tests, one machine).
  bool insecure = false;
  uint32_t timeout_ms = 3000;  // connect, write and read of one request
  // A response body longer than this is refused (kProtocol); Range pages
  // with `limit` keep honest responses far below it.
  size_t max_response_bytes = size_t{64} << 20;
  LogFn log;  // endpoint switches (null: stderr)
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;
  bool more = false;     // a limit cut the result short
  int64_t revision = 0;  // the store revision the range was read at
};

// One comparison of a txn: `target` of `key` `op` the given value.
struct EtcdCompare {
  enum class Target : uint8_t { kValue, kCreateRevision, kModRevision, kVersion, kLease };
  enum class Op : uint8_t { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kValue;
  Op op = Op::kEqual;
  std::string value;   // for kValue
  int64_t number = 0;  // for the others

  static EtcdCompare Absent(std::string key) {  // create_revision == 0
    return {std::move(key), Target::kCreateRevision, Op::kEqual, {}, 0};
  }
  static EtcdCompare ValueIs(std::string key, std::string value) {
    return {std::move(key), Target::kValue, Op::kEqual, std::move(value), 0};
  }
  static EtcdCompare CreatedAt(std::string key, int64_t revision) {
    return {std::move(key), Target::kCreateRevision, Op::kEqual, {}, revision};
  }
};

// One operation of a txn branch.
struct EtcdOp {
  enum class Type : uint8_t { kPut, kGet, kDelete };
  Type type = Type::kGet;
  std::string key;
  std::string value;      // kPut
  int64_t lease = 0;      // kPut: 0 = none
  std::string range_end;  // kDelete: delete [key, range_end) (empty: key alone)

  static EtcdOp Put(std::string key, std::string value, int64_t lease = 0) {
    return {Type::kPut, std::move(key), std::move(value), lease, {}};
  }
  static EtcdOp Get(std::string key) { return {Type::kGet, std::move(key), {}, 0, {}}; }
  static EtcdOp Delete(std::string key) { return {Type::kDelete, std::move(key), {}, 0, {}}; }
  static EtcdOp DeleteRange(std::string key, std::string range_end) {
    return {Type::kDelete, std::move(key), {}, 0, std::move(range_end)};
  }
};

struct EtcdTxnResult {
  bool succeeded = false;  // every compare held: the success branch ran
  int64_t revision = 0;
  // One per kGet of the branch that ran, in order.
  std::vector<EtcdRange> gets;
};

class EtcdClient {
 public:
  // Validates the options; connects lazily (the first request).
  static Result<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Returns the revision of the put.
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // The key's entry, or an empty range.
  Result<EtcdRange> Get(const std::string& key);
  // Keys starting with `prefix` (non-empty), in key order, at most `limit`
  // (1 .. 100000), starting at `start_key` (inclusive; empty: the prefix),
  // read at `revision` (0: latest).
  Result<EtcdRange> GetPrefix(const std::string& prefix, uint32_t limit,
                              const std::string& start_key = {}, int64_t revision = 0);
  // Returns how many keys were deleted.
  Result<int64_t> Delete(const std::string& key);
  Result<int64_t> DeletePrefix(const std::string& prefix);
  // The smallest key above every key that starts with `prefix`: a range_end.
  static std::string PrefixEnd(const std::string& prefix);
  // At most 64 compares and 64 ops per branch.
  Result<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                            const std::vector<EtcdOp>& success, const std::vector<EtcdOp>& failure);

  struct Lease {
    int64_t id = 0;
    int64_t ttl_s = 0;  // as granted (etcd may raise it to its minimum)
  };
  Result<Lease> LeaseGrant(int64_t ttl_s);
  // One keep-alive; returns the TTL now left. kNotFound once it expired.
  Result<int64_t> LeaseKeepAlive(int64_t id);
  Status LeaseRevoke(int64_t id);

 private:
  struct Impl;
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct ElectionOptions {
  std::string prefix;       // the election's key is prefix + "/leader"
  std::string id;           // this candidate (non-empty, <= 1 KiB), the key's value
  int64_t lease_ttl_s = 5;  // 1 .. 3600
  // Called once, from the keep-alive thread, when leadership is lost after
  // Campaign returned (lease expired or revoked, key deleted or taken, or
  // etcd unreachable for a whole TTL: then we cannot know, so we assume the
  // worst). Not called because of Resign or the destructor (a loss detected
  // just before them may still be reported while they wait for the thread).
  // Must not destroy the Election; calling Resign from it is fine.
  std::function<void(const Status&)> on_lost;
  LogFn log;
};

// Leadership of one key: held while our lease lives. Destroying an Election
// resigns (revokes the lease, best effort).
class Election {
 public:
  // Blocks until this candidate holds the key (kTimeout after timeout_ms;
  // 0 = one attempt). While waiting it polls every poll_ms on `clock`.
  static Result<std::unique_ptr<Election>> Campaign(const EtcdOptions& etcd,
                                                    ElectionOptions options, Clock& clock,
                                                    uint64_t timeout_ms, uint32_t poll_ms = 200);
  ~Election();
  Election(const Election&) = delete;
  Election& operator=(const Election&) = delete;

  // Still the leader as far as the last keep-alive knows (at most ~TTL/3 old).
  bool IsLeader() const { return leader_.load(); }
  // A compare that holds only while this leadership lasts: add it to every
  // write a leader makes (EtcdBoardLogOptions::fence), so that a deposed
  // leader's late write fails in etcd rather than racing its successor.
  EtcdCompare Fence() const { return EtcdCompare::CreatedAt(key_, created_revision_); }
  int64_t lease_id() const { return lease_id_; }
  // The revision our key was created at: each new leader's is larger (the
  // root's incarnation in its HEAD beacons).
  int64_t created_revision() const { return created_revision_; }
  const std::string& key() const { return key_; }
  // Gives leadership up now (deletes our key with the lease). Idempotent.
  Status Resign();

  // Who holds prefix + "/leader" now (empty string: nobody).
  static Result<std::string> Leader(EtcdClient& client, const std::string& prefix);

 private:
  Election(std::unique_ptr<EtcdClient> client, ElectionOptions options, Clock& clock,
           std::string key, int64_t lease_id, int64_t ttl_s, int64_t created_revision);
  void KeepAliveLoop();
  void Lost(const Status& why);

  std::unique_ptr<EtcdClient> client_;
  ElectionOptions options_;
  Clock& clock_;
  const std::string key_;
  const int64_t lease_id_;
  const int64_t ttl_s_;
  const int64_t created_revision_;
  std::atomic<bool> leader_{true};
  std::atomic<bool> stop_{false};
  std::atomic<bool> resigned_{false};  // the first Resign joins the thread and revokes
  std::thread keepalive_;
};

}  // namespace tern::agent
