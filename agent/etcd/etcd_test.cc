// The etcd client and election against a real etcd on loopback
// (agent/testing/etcd_test_server.h); skipped only when there is no etcd binary.
#include "agent/etcd/etcd.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "agent/testing/etcd_suite.h"
#include "agent/testing/etcd_test_server.h"

namespace tern::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

EtcdOptions OptionsFor(const EtcdTestServer& server, uint32_t timeout_ms = 3000) {
  EtcdOptions o;
  o.endpoints = {server.endpoint()};
  o.timeout_ms = timeout_ms;
  o.log = [](std::string_view) {};
  return o;
}

std::unique_ptr<EtcdClient> MustClient(const EtcdOptions& o) {
  auto c = EtcdClient::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Waits (bounded) until pred() holds.
template <class Pred>
bool WaitFor(Pred pred, milliseconds limit) {
  const auto deadline = steady_clock::now() + limit;
  while (!pred()) {
    if (steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

#define START_ETCD(var)                                                           \
  auto var##_started = EtcdTestServer::Start();                                   \
  if (!var##_started.ok() && var##_started.status().code() == Code::kUnsupported) \
    GTEST_SKIP() << var##_started.status().ToString();                            \
  ASSERT_TRUE(var##_started.ok()) << var##_started.status().ToString();           \
  EtcdTestServer& var = **var##_started

// One etcd for the tests that do not stop it; each test uses its own keys.
class EtcdTest : public SharedEtcdTest<EtcdTest> {
 protected:
  void SetUp() override {
    SharedEtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    client_ = MustClient(OptionsFor(etcd()));
  }
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdTest, PutGetRoundTripsBinaryKeysAndValues) {
  const std::string key = std::string("bin/\0\xff\x01k", 8);
  std::string value(3000, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 7);
  auto rev = client_->Put(key, value);
  ASSERT_TRUE(rev.ok()) << rev.status().ToString();
  EXPECT_GT(*rev, 0);
  auto got = client_->Get(key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].key, key);
  EXPECT_EQ(got->kvs[0].value, value);
  EXPECT_EQ(got->kvs[0].mod_revision, *rev);
  EXPECT_EQ(got->kvs[0].version, 1);

  // An empty value is a value (proto3 omits it on the wire).
  ASSERT_TRUE(client_->Put("bin/empty", "").ok());
  got = client_->Get("bin/empty");
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "");

  got = client_->Get("bin/absent");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->kvs.empty());

  auto deleted = client_->Delete(key);
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 1);
  got = client_->Get(key);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->kvs.empty());
}

TEST_F(EtcdTest, GetPrefixPagesInKeyOrderAndStaysInsideThePrefix) {
  for (int i = 0; i < 25; ++i) {
    char key[32];
    snprintf(key, sizeof(key), "pre/a/%03d", i);
    ASSERT_TRUE(client_->Put(key, std::to_string(i)).ok());
  }
  ASSERT_TRUE(client_->Put("pre/b/0", "outside").ok());
  ASSERT_TRUE(client_->Put("pre/a", "the prefix itself is not under pre/a/").ok());
  std::vector<std::string> seen;
  std::string start;
  int64_t revision = 0;
  for (int page = 0; page < 10; ++page) {
    auto r = client_->GetPrefix("pre/a/", 10, start, revision);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (revision == 0) revision = r->revision;
    for (const EtcdKeyValue& kv : r->kvs) seen.push_back(kv.key);
    EXPECT_EQ(r->more, seen.size() < 25);
    if (!r->more) break;
    start = r->kvs.back().key + std::string(1, '\0');
  }
  ASSERT_EQ(seen.size(), 25u);
  for (int i = 0; i < 25; ++i) {
    char key[32];
    snprintf(key, sizeof(key), "pre/a/%03d", i);
    EXPECT_EQ(seen[i], key);
  }
  auto n = client_->DeletePrefix("pre/a/");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 25);
  auto b = client_->Get("pre/b/0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->kvs.size(), 1u);
}

TEST_F(EtcdTest, TxnCompareAndSwapLetsExactlyOneWriterWin) {
  // Create-if-absent: the second writer loses and reads the winner.
  auto first = client_->Txn({EtcdCompare::Absent("cas/k")}, {EtcdOp::Put("cas/k", "A")},
                            {EtcdOp::Get("cas/k")});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->succeeded);
  EXPECT_TRUE(first->gets.empty());
  auto second = client_->Txn({EtcdCompare::Absent("cas/k")}, {EtcdOp::Put("cas/k", "B")},
                             {EtcdOp::Get("cas/k")});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(second->succeeded);
  ASSERT_EQ(second->gets.size(), 1u);
  ASSERT_EQ(second->gets[0].kvs.size(), 1u);
  EXPECT_EQ(second->gets[0].kvs[0].value, "A");
  EXPECT_EQ(second->gets[0].kvs[0].create_revision, first->revision);

  // Value CAS: A -> C holds once; a stale A -> D fails.
  auto swap = client_->Txn({EtcdCompare::ValueIs("cas/k", "A")}, {EtcdOp::Put("cas/k", "C")}, {});
  ASSERT_TRUE(swap.ok());
  EXPECT_TRUE(swap->succeeded);
  auto stale = client_->Txn({EtcdCompare::ValueIs("cas/k", "A")}, {EtcdOp::Put("cas/k", "D")}, {});
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(stale->succeeded);
  auto now = client_->Get("cas/k");
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->kvs[0].value, "C");

  // Many threads race one create: exactly one wins.
  std::atomic<int> wins{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto c = EtcdClient::Create(OptionsFor(etcd()));
      if (!c.ok()) {
        ++errors;
        return;
      }
      auto r = (*c)->Txn({EtcdCompare::Absent("cas/race")},
                         {EtcdOp::Put("cas/race", std::to_string(t))}, {});
      if (!r.ok())
        ++errors;
      else if (r->succeeded)
        ++wins;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(wins.load(), 1);
}

TEST_F(EtcdTest, OneClientServesManyThreads) {
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        const std::string key = "mt/" + std::to_string(t) + "/" + std::to_string(i);
        if (!client_->Put(key, key).ok()) ++bad;
        auto g = client_->Get(key);
        if (!g.ok() || g->kvs.size() != 1 || g->kvs[0].value != key) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  auto all = client_->GetPrefix("mt/", 1000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->kvs.size(), 32u);
}

TEST_F(EtcdTest, LeasesKeepKeysAliveUntilRevoked) {
  auto lease = client_->LeaseGrant(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_NE(lease->id, 0);
  EXPECT_GE(lease->ttl_s, 5);
  ASSERT_TRUE(client_->Put("lease/k", "v", lease->id).ok());
  auto ttl = client_->LeaseKeepAlive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GE(*ttl, 4);
  auto got = client_->Get("lease/k");
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].lease, lease->id);

  ASSERT_TRUE(client_->LeaseRevoke(lease->id).ok());
  got = client_->Get("lease/k");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->kvs.empty()) << "revoking a lease deletes its keys";
  ttl = client_->LeaseKeepAlive(lease->id);
  EXPECT_EQ(ttl.status().code(), Code::kNotFound) << ttl.status().ToString();
  // A put with an unknown lease is etcd's error, mapped.
  auto put = client_->Put("lease/k", "v", lease->id);
  EXPECT_EQ(put.status().code(), Code::kNotFound) << put.status().ToString();
}

TEST_F(EtcdTest, LeaseExpiresWithoutKeepAlive) {
  auto lease = client_->LeaseGrant(1);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client_->Put("lease/short", "v", lease->id).ok());
  EXPECT_TRUE(WaitFor(
      [&] {
        auto g = client_->Get("lease/short");
        return g.ok() && g->kvs.empty();
      },
      milliseconds(10000)));
}

TEST(EtcdClientTest, RefusesBadArgumentsBeforeSending) {
  EtcdOptions o;
  EXPECT_EQ(EtcdClient::Create(o).status().code(), Code::kInvalidArgument);  // no endpoint
  for (const char* bad : {"nohost", ":2379", "h:", "h:0", "h:70000", "h:12x"}) {
    o.endpoints = {bad};
    EXPECT_EQ(EtcdClient::Create(o).status().code(), Code::kInvalidArgument) << bad;
  }
  o.endpoints = {"unix://127.0.0.1:1"};
  EXPECT_EQ(EtcdClient::Create(o).status().code(), Code::kUnsupported);
  // Port 1 on loopback: nothing listens, and nothing must be sent anyway.
  o.endpoints = {"http://127.0.0.1:1/"};
  auto c = EtcdClient::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->Put("", "v").status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*c)->Put(std::string(kEtcdMaxKeyBytes + 1, 'k'), "v").status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ((*c)->Put("k", std::string(kEtcdMaxValueBytes + 1, 'v')).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ((*c)->LeaseGrant(0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*c)->GetPrefix("p", 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*c)->GetPrefix("p", 10, "q").status().code(), Code::kInvalidArgument);
  std::vector<EtcdCompare> many(65, EtcdCompare::Absent("k"));
  EXPECT_EQ((*c)->Txn(many, {}, {}).status().code(), Code::kInvalidArgument);
}

TEST(EtcdClientTest, UnreachableIsUnavailableAndBounded) {
  EtcdOptions o;
  o.endpoints = {"127.0.0.1:1"};
  o.timeout_ms = 500;
  auto c = EtcdClient::Create(o);
  ASSERT_TRUE(c.ok());
  const auto start = steady_clock::now();
  auto r = (*c)->Get("k");
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_LT(steady_clock::now() - start, milliseconds(3000));
}

// A server that is not etcd: every reply must be refused, none may crash.
TEST(EtcdClientTest, RefusesWhatIsNotAnEtcdGateway) {
  httplib::Server fake;
  std::string reply;
  int status = 200;
  std::mutex mu;
  fake.Post(".*", [&](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    res.status = status;
    res.set_content(reply, "application/json");
  });
  fake.set_keep_alive_timeout(1);  // the client drops a connection after each refusal
  const int port = fake.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serve([&] { fake.listen_after_bind(); });
  ASSERT_TRUE(WaitFor([&] { return fake.is_running(); }, milliseconds(5000)));
  EtcdOptions o;
  o.endpoints = {"127.0.0.1:" + std::to_string(port)};
  o.max_response_bytes = 64 << 10;
  auto c = EtcdClient::Create(o);
  ASSERT_TRUE(c.ok());
  struct Case {
    int status;
    std::string body;
    Code want;
  };
  const std::vector<Case> cases = {
      {200, "not json", Code::kProtocol},
      {200, "[1,2]", Code::kProtocol},
      {404, "Not Found", Code::kProtocol},
      {500, "{}", Code::kProtocol},
      {200, R"({"header":{"revision":"x"},"kvs":[]})", Code::kProtocol},
      {200, R"({"header":{},"kvs":[{"key":"!!!!"}]})", Code::kProtocol},
      {200, R"({"header":{},"kvs":[{"key":"b3RoZXI="}]})", Code::kProtocol},  // "other"
      {200, R"({"kvs":[{"key":"aw=="},{"key":"aw=="}]})", Code::kProtocol},   // 2 for 1 key
      {200, "{\"pad\":\"" + std::string(100 << 10, 'x') + "\"}", Code::kProtocol},
      {503, R"({"error":"etcdserver: no leader","code":14})", Code::kUnavailable},
      {400, R"({"error":"bad","code":3,"message":"bad"})", Code::kInvalidArgument},
  };
  for (const Case& k : cases) {
    {
      std::lock_guard<std::mutex> lock(mu);
      status = k.status;
      reply = k.body;
    }
    auto r = (*c)->Get("k");
    EXPECT_EQ(r.status().code(), k.want) << k.body.substr(0, 80) << " -> " << r.status().ToString();
    auto p = (*c)->GetPrefix("k", 10);
    if (k.body.find("b3RoZXI=") != std::string::npos) {
      EXPECT_EQ(p.status().code(), Code::kProtocol) << "a key outside the prefix";
    }
  }
  // A txn whose response count does not match its ops.
  {
    std::lock_guard<std::mutex> lock(mu);
    status = 200;
    reply = R"({"header":{"revision":"3"},"succeeded":true,"responses":[]})";
  }
  auto t = (*c)->Txn({}, {EtcdOp::Get("k")}, {});
  EXPECT_EQ(t.status().code(), Code::kProtocol) << t.status().ToString();
  // A keepalive for an expired lease (no TTL) is kNotFound.
  {
    std::lock_guard<std::mutex> lock(mu);
    reply = R"({"result":{"header":{},"ID":"5"}})";
  }
  EXPECT_EQ((*c)->LeaseKeepAlive(5).status().code(), Code::kNotFound);
  fake.stop();
  serve.join();
}

TEST_F(EtcdTest, NextEndpointAfterAConnectionFailure) {
  EtcdOptions o = OptionsFor(etcd(), 500);
  o.endpoints = {"127.0.0.1:1", etcd().endpoint()};
  std::vector<std::string> lines;
  o.log = [&](std::string_view line) { lines.emplace_back(line); };
  auto c = EtcdClient::Create(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Put("ep/k", "v").status().code(), Code::kUnavailable);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("next request goes to " + etcd().endpoint()), std::string::npos)
      << lines[0];
  auto r = (*c)->Put("ep/k", "v");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

// ---- election ----

ElectionOptions Candidate(const std::string& prefix, const std::string& id, int64_t ttl_s,
                          std::function<void(const Status&)> on_lost = {}) {
  ElectionOptions e;
  e.prefix = prefix;
  e.id = id;
  e.lease_ttl_s = ttl_s;
  e.on_lost = std::move(on_lost);
  e.log = [](std::string_view) {};
  return e;
}

TEST_F(EtcdTest, OneLeaderAtATime) {
  auto a = Election::Campaign(OptionsFor(etcd()), Candidate("el1", "a", 5), SteadyClock(), 5000);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE((*a)->IsLeader());
  auto who = Election::Leader(*client_, "el1");
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(*who, "a");
  auto b = Election::Campaign(OptionsFor(etcd()), Candidate("el1", "b", 5), SteadyClock(), 600);
  EXPECT_EQ(b.status().code(), Code::kTimeout) << b.status().ToString();
  EXPECT_NE(b.status().message().find("held by 'a'"), std::string::npos);
  // b's lease was revoked on giving up: nothing of b is left behind.
  who = Election::Leader(*client_, "el1");
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(*who, "a");
  // An argument check.
  EXPECT_EQ(Election::Campaign(OptionsFor(etcd()), Candidate("el1", "", 5), SteadyClock(), 0)
                .status()
                .code(),
            Code::kInvalidArgument);
}

TEST_F(EtcdTest, ResignHandsOverAtOnce) {
  auto a = Election::Campaign(OptionsFor(etcd()), Candidate("el2", "a", 30), SteadyClock(), 5000);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  Result<std::unique_ptr<Election>> b = Status(Code::kInternal, "not run");
  std::thread standby([&] {
    b = Election::Campaign(OptionsFor(etcd()), Candidate("el2", "b", 30), SteadyClock(), 20000,
                           50);
  });
  std::this_thread::sleep_for(milliseconds(300));
  const auto resigned_at = steady_clock::now();
  ASSERT_TRUE((*a)->Resign().ok());
  EXPECT_FALSE((*a)->IsLeader());
  standby.join();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  // Well under the 30 s TTL: the revoke deleted the key.
  EXPECT_LT(steady_clock::now() - resigned_at, milliseconds(5000));
  auto who = Election::Leader(*client_, "el2");
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(*who, "b");
}

TEST_F(EtcdTest, StandbyTakesOverWhenTheLeadersLeaseLapses) {
  // A leader that died: its key is leased but nobody keeps the lease alive.
  auto lease = client_->LeaseGrant(2);
  ASSERT_TRUE(lease.ok());
  auto t = client_->Txn({EtcdCompare::Absent("el3/leader")},
                        {EtcdOp::Put("el3/leader", "dead", lease->id)}, {});
  ASSERT_TRUE(t.ok() && t->succeeded);
  const auto start = steady_clock::now();
  auto b =
      Election::Campaign(OptionsFor(etcd()), Candidate("el3", "b", 5), SteadyClock(), 15000, 50);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const auto waited = steady_clock::now() - start;
  EXPECT_GE(waited, milliseconds(1000)) << "took over before the dead leader's lease lapsed";
  auto who = Election::Leader(*client_, "el3");
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(*who, "b");
}

TEST_F(EtcdTest, LeaderLearnsItLostWhenItsLeaseIsRevoked) {
  std::mutex mu;
  std::condition_variable cv;
  int lost = 0;
  Status why;
  std::atomic<Election*> self{nullptr};
  Status resigned_from_callback(Code::kInternal, "not called");
  auto a = Election::Campaign(OptionsFor(etcd()),
                              Candidate("el4", "a", 3,
                                        [&](const Status& s) {
                                          // Resign from on_lost must not deadlock.
                                          Status r = self.load()->Resign();
                                          std::lock_guard<std::mutex> lock(mu);
                                          ++lost;
                                          why = s;
                                          resigned_from_callback = r;
                                          cv.notify_all();
                                        }),
                              SteadyClock(), 5000);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  self = a->get();
  const EtcdCompare fence = (*a)->Fence();
  auto fenced = client_->Txn({fence}, {EtcdOp::Put("el4/data", "1")}, {});
  ASSERT_TRUE(fenced.ok());
  EXPECT_TRUE(fenced->succeeded) << "the fence holds while leading";

  ASSERT_TRUE(client_->LeaseRevoke((*a)->lease_id()).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return lost > 0; }));
  }
  EXPECT_FALSE((*a)->IsLeader());
  EXPECT_TRUE(why.code() == Code::kNotFound || why.code() == Code::kMismatch) << why.ToString();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(resigned_from_callback.ok()) << resigned_from_callback.ToString();
  }
  fenced = client_->Txn({fence}, {EtcdOp::Put("el4/data", "2")}, {});
  ASSERT_TRUE(fenced.ok());
  EXPECT_FALSE(fenced->succeeded) << "a deposed leader's fenced write must fail";
  // A new leader gets another fence: the old one still fails.
  auto b = Election::Campaign(OptionsFor(etcd()), Candidate("el4", "b", 3), SteadyClock(), 5000);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  fenced = client_->Txn({fence}, {EtcdOp::Put("el4/data", "3")}, {});
  ASSERT_TRUE(fenced.ok());
  EXPECT_FALSE(fenced->succeeded);
  fenced = client_->Txn({(*b)->Fence()}, {EtcdOp::Put("el4/data", "4")}, {});
  ASSERT_TRUE(fenced.ok());
  EXPECT_TRUE(fenced->succeeded);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(lost, 1) << "on_lost is called once";
}

TEST(EtcdServerTest, LeaderKeepsItsLeaseAcrossAnEtcdRestart) {
  START_ETCD(server);
  auto client = MustClient(OptionsFor(server, 1000));
  ASSERT_TRUE(client->Put("persist/k", "v").ok());
  std::atomic<int> lost{0};
  auto a = Election::Campaign(OptionsFor(server, 1000),
                              Candidate("el5", "a", 10, [&](const Status&) { ++lost; }),
                              SteadyClock(), 5000);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(server.Stop().ok());
  ASSERT_TRUE(server.Restart().ok());
  // Data survived; the client reconnects by itself.
  Result<EtcdRange> got = Status(Code::kInternal, "");
  ASSERT_TRUE(WaitFor([&] { return (got = client->Get("persist/k")).ok(); }, milliseconds(5000)));
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "v");
  // etcd refreshes leases on restart: the leader is still the leader after
  // more than one keep-alive round.
  std::this_thread::sleep_for(milliseconds(4000));
  EXPECT_TRUE((*a)->IsLeader());
  EXPECT_EQ(lost.load(), 0);
  auto who = Election::Leader(*client, "el5");
  ASSERT_TRUE(who.ok()) << who.status().ToString();
  EXPECT_EQ(*who, "a");
}

TEST(EtcdServerTest, LeaderGivesUpWhenEtcdIsGoneForTheLease) {
  START_ETCD(server);
  std::atomic<int> lost{0};
  Status why;
  std::mutex mu;
  auto a = Election::Campaign(OptionsFor(server, 500),
                              Candidate("el6", "a", 3,
                                        [&](const Status& s) {
                                          std::lock_guard<std::mutex> lock(mu);
                                          why = s;
                                          ++lost;
                                        }),
                              SteadyClock(), 5000);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const auto killed_at = steady_clock::now();
  ASSERT_TRUE(server.Kill().ok());
  ASSERT_TRUE(WaitFor([&] { return lost.load() > 0; }, milliseconds(10000)));
  EXPECT_FALSE((*a)->IsLeader());
  // Before the 3 s lease could have lapsed (plus one request timeout).
  EXPECT_LT(steady_clock::now() - killed_at, milliseconds(3500));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(why.code(), Code::kUnavailable) << why.ToString();
}

}  // namespace
}  // namespace tern::agent
