// tern-sidecar end to end against the engine double (fake_engine.h): the
// seed system's lane as its clients send it, bad input, streaming, client
// disconnects, a killed engine, control routes, catch-up waits, the version
// follower, and the invariant under concurrency.
#include "agent/sidecar/sidecar.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <future>
#include <random>
#include <regex>
#include <thread>

#include "agent/ops/admin_http.h"
#include "agent/sidecar/fake_engine.h"
#include "agent/sidecar/version_follower.h"
#include "base/text.h"
#include "tern/sidecar.h"
#include "transport/test_certs.h"

namespace tern::agent {
namespace {

using testing::FakeEngine;
using namespace std::chrono_literals;

struct Reply {
  int status = 0;  // 0: no answer
  std::string error;
  httplib::Headers headers;
  std::string body;
  Json json() const { return Json::parse(body, nullptr, false); }
  std::string header(const char* k) const {
    auto it = headers.find(k);
    return it == headers.end() ? "" : it->second;
  }
};

// One HTTP client, as a rollout worker holds one (keep-alive).
class Client {
 public:
  explicit Client(const std::string& address) {
    auto hp = ParseHostPort(address);
    cli_ = std::make_unique<httplib::Client>(hp->host, hp->port);
    cli_->set_keep_alive(true);
    cli_->set_read_timeout(10s);
  }
  Reply Send(const std::string& method, const std::string& path, const std::string& body = "",
             httplib::Headers headers = {},
             std::function<bool(std::string_view)> on_piece = nullptr) {
    httplib::Request req;
    req.method = method;
    req.path = path;
    req.headers = std::move(headers);
    if (!body.empty() || method == "POST") {
      req.body = body;
      req.headers.emplace("Content-Type", "application/json");
    }
    Reply r;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      r.body.append(d, n);
      return on_piece ? on_piece(std::string_view(d, n)) : true;
    };
    httplib::Response res;
    httplib::Error error;
    if (cli_->send(req, res, error) || res.status > 0) {
      r.status = res.status;
      r.headers = res.headers;
    } else {
      r.error = httplib::to_string(error);
    }
    return r;
  }
  Reply Post(const std::string& path, const Json& body, httplib::Headers headers = {}) {
    return Send("POST", path, body.dump(), std::move(headers));
  }

 private:
  std::unique_ptr<httplib::Client> cli_;
};

// The data events of a stream, parsed.
std::vector<Json> Events(const std::string& stream, bool* done = nullptr) {
  std::vector<Json> out;
  if (done) *done = false;
  for (size_t pos = 0; pos < stream.size();) {
    size_t eol = stream.find("\n\n", pos);
    if (eol == std::string::npos) break;
    std::string event = stream.substr(pos, eol - pos);
    pos = eol + 2;
    if (event == "data: [DONE]") {
      if (done) *done = true;
    } else if (event.starts_with("data: ")) {
      out.push_back(Json::parse(event.substr(6), nullptr, false));
    }
  }
  return out;
}

class SidecarTest : public ::testing::Test {
 protected:
  void StartSidecar(CommitMode mode = CommitMode::kInPlace,
                    std::function<ReplicaState()> state = nullptr, bool refuse_when_stale = false) {
    gate_ = std::make_unique<VersionGate>(mode);
    SidecarOptions o;
    o.listen = "127.0.0.1:0";
    o.engine.url = engine_.url();
    o.engine.connect_timeout_ms = 500;
    o.engine.read_timeout_ms = 5000;
    o.admin_token = "sekrit";
    o.max_body_bytes = 64 << 10;
    o.catchup_wait_ms = 300;
    o.client_timeout_ms = 500;
    o.log = [](std::string_view) {};
    o.refuse_when_stale = refuse_when_stale;
    auto s = Sidecar::Start(std::move(o), *gate_, std::move(state));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    sidecar_ = std::move(*s);
    client_ = std::make_unique<Client>(sidecar_->address());
  }
  void Serve(uint64_t v) {
    gate_->SetHead(v);
    ASSERT_TRUE(gate_
                    ->Commit(
                        v,
                        [&] {
                          engine_.version = v;
                          return Status::Ok();
                        },
                        5000)
                    .ok());
  }
  // Requests in flight once they settle: a stream's ticket is released just
  // after its last bytes are written, so a client can see the end first.
  uint64_t InFlightSettled() {
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (gate_->in_flight() != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    return gate_->in_flight();
  }
  void TearDown() override {
    client_.reset();  // else Stop waits for its keep-alive connection to idle out
    if (sidecar_) sidecar_->Stop();
  }

  FakeEngine engine_;
  std::unique_ptr<VersionGate> gate_;
  std::unique_ptr<Sidecar> sidecar_;
  std::unique_ptr<Client> client_;
};

// Written as the seed system's clients and pool probe use the lane: the
// exact JSON they send and read (stitch's types.py and service.py).
TEST_F(SidecarTest, SeedSystemClientWorksUnchanged) {
  StartSidecar();
  Reply health = client_->Send("GET", "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.json()["ready"], false);
  EXPECT_TRUE(health.json()["reason"].is_string());
  Json info = client_->Send("GET", "/server_info").json();
  EXPECT_EQ(info["ready"], false);
  EXPECT_TRUE(info["applied"].is_null());
  Json lane = {{"min_version", 3}, {"exact_version", nullptr}};
  Reply early = client_->Post("/v1/completions",
                              {{"model", "m"}, {"prompt", "hi"}, {"weight_version", lane}});
  EXPECT_EQ(early.status, 409);
  EXPECT_EQ(early.json(),
            Json::parse(
                R"({"type":"WeightVersionNotReady","target_version":3,"applied":null,"message":)" +
                early.json()["message"].dump() + "}"));

  Serve(3);
  EXPECT_EQ(client_->Send("GET", "/health").json(), Json::parse(R"({"ready":true})"));
  info = client_->Send("GET", "/server_info").json();
  EXPECT_EQ(info["ready"], true);
  // ReplicaState.from_dict parses "applied" with VersionRef.parse.
  EXPECT_TRUE(std::regex_match(info["applied"].get<std::string>(), std::regex("weight_v0*3")));
  EXPECT_EQ(info["sync_state"], "IDLE");

  Reply ok = client_->Post("/v1/completions",
                           {{"model", "m"}, {"prompt", "hi"}, {"weight_version", lane}});
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.json()["weight_version_start"], 3);
  EXPECT_EQ(ok.json()["weight_version_end"], 3);
  EXPECT_EQ(ok.json()["choices"][0]["text"], "ok");
  EXPECT_EQ(ok.header("X-Tern-Version"), "3");
  EXPECT_NE(
      client_->Send("GET", "/metrics")
          .body.find("tern_sidecar_requests_total{route=\"/v1/completions\",version=\"3\"} 1"),
      std::string::npos);
  Json forwarded = Json::parse(engine_.last_body());
  EXPECT_FALSE(forwarded.contains("weight_version"));
  EXPECT_EQ(forwarded["cache_salt"], "tern-v3");
  EXPECT_EQ(forwarded["prompt"], "hi");

  Json exact2 = {{"min_version", nullptr}, {"exact_version", 2}};
  Reply stale = client_->Post("/v1/chat/completions",
                              {{"messages", Json::array()}, {"weight_version", exact2}});
  EXPECT_EQ(stale.status, 409);
  EXPECT_EQ(stale.json()["target_version"], 2);
  EXPECT_EQ(stale.json()["applied"], 3);

  Reply chat = client_->Post("/v1/chat/completions", {{"messages", Json::array()}});
  EXPECT_EQ(chat.json()["weight_version_start"], 3);
  Reply gen = client_->Post("/generate",
                            {{"text", "hi"},
                             {"extra_key", "u"},
                             {"weight_version", {{"min_version", 1}, {"exact_version", nullptr}}}});
  ASSERT_EQ(gen.status, 200) << gen.body;
  EXPECT_EQ(gen.json()["meta_info"]["weight_version"], "3");
  EXPECT_EQ(gen.json()["meta_info"]["weight_version_start"], 3);
  EXPECT_EQ(gen.json()["meta_info"]["weight_version_end"], 3);
  EXPECT_EQ(Json::parse(engine_.last_body())["extra_key"], "tern-v3;u");
}

TEST_F(SidecarTest, BadInputIsRefusedAndTheSidecarGoesOn) {
  StartSidecar();
  Serve(1);
  auto bad = [&](const std::string& body, const char* says) {
    Reply r = client_->Send("POST", "/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_EQ(r.json()["error"]["type"], "BadRequest") << r.body;
    EXPECT_NE(r.json()["error"]["message"].get<std::string>().find(says), std::string::npos)
        << r.body;
  };
  bad("{\"prompt\": ", "not valid JSON");
  bad("[1,2]", "JSON object");
  bad(R"({"weight_version": "3"})", "weight_version must be an object");
  bad(R"({"weight_version": {"min_version": "3"}})", "min_version");
  bad(R"({"weight_version": {"exact_version": -2}})", "exact_version");
  bad(R"({"weight_version": {"exact": 2}})", "unknown key");
  // Not the lane's business: forwarded, the engine's reply stamped.
  Reply odd = client_->Send("POST", "/v1/completions", R"({"stream":"yes"})");
  EXPECT_EQ(odd.status, 200) << odd.body;
  EXPECT_EQ(odd.json()["weight_version_start"], 1);
  Reply header = client_->Send("POST", "/v1/completions", "{}", {{"X-Tern-Min-Version", "two"}});
  EXPECT_EQ(header.status, 400);

  Reply huge = client_->Send("POST", "/v1/completions",
                             "{\"prompt\":\"" + std::string(100 << 10, 'a') + "\"}");
  EXPECT_EQ(huge.status, 413);
  EXPECT_EQ(huge.json()["error"]["type"], "PayloadTooLarge") << huge.body;

  auto hp = ParseHostPort(sidecar_->address());
  // Raw bytes on a fresh connection; the first bytes of the answer.
  auto raw = [&](const std::string& bytes, std::chrono::milliseconds* took) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(hp->port);
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    const auto t0 = std::chrono::steady_clock::now();
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (took)
      *took = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - t0);
    ::close(fd);
    return n > 0 ? std::string(buf, n) : std::string();
  };
  // A TLS ClientHello's first bytes, a NUL and a non-ASCII byte.
  static constexpr char kGarbage[] = "\x16\x03\x01garbage\0\xff\r\n\r\n";
  EXPECT_TRUE(raw(std::string(kGarbage, sizeof kGarbage - 1), nullptr).starts_with("HTTP/1.1 400"));
  // A slow client: half a body, then nothing. Refused after the sidecar's
  // 500 ms client timeout, not held.
  std::chrono::milliseconds took{};
  std::string answer =
      raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro", &took);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 4")) << answer;
  EXPECT_GE(took, 400ms);
  EXPECT_LT(took, 3s);
  Reply after = client_->Post("/v1/completions", {{"prompt", "p"}});
  EXPECT_EQ(after.status, 200);
  std::string metrics = client_->Send("GET", "/metrics").body;
  EXPECT_NE(metrics.find("tern_sidecar_refusals_total{reason=\"bad_request\"}"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("tern_sidecar_refusals_total{reason=\"too_large\"} 1"), std::string::npos)
      << metrics;
}

TEST_F(SidecarTest, StreamsEventByEventStamped) {
  StartSidecar();
  Serve(5);
  engine_.delay_ms = 20;
  std::vector<std::chrono::steady_clock::time_point> arrivals;
  Reply r =
      client_->Send("POST", "/v1/completions", R"({"prompt":"p","stream":true,"max_tokens":5})", {},
                    [&](std::string_view) {
                      arrivals.push_back(std::chrono::steady_clock::now());
                      return true;
                    });
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.header("Content-Type").find("text/event-stream"), std::string::npos);
  EXPECT_EQ(r.header("X-Tern-Version"), "5");
  bool done = false;
  auto events = Events(r.body, &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(events.size(), 5u);
  for (const auto& e : events) {
    EXPECT_EQ(e["weight_version_start"], 5);
    EXPECT_EQ(e["weight_version_end"], 5);
    EXPECT_EQ(e["engine_version"], 5);
  }
  // Passed on as they come, not buffered: pieces arrived spread over the
  // engine's 4 x 20 ms.
  ASSERT_GE(arrivals.size(), 3u);
  EXPECT_GE(arrivals.back() - arrivals.front(), 40ms);
}

TEST_F(SidecarTest, ClientThatLeavesAbortsTheEngineRequest) {
  StartSidecar();
  Serve(1);
  engine_.delay_ms = 20;
  int pieces = 0;
  client_->Send("POST", "/v1/completions", R"({"prompt":"p","stream":true,"max_tokens":100000})",
                {}, [&](std::string_view) { return ++pieces < 2; });
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (engine_.streams_cut == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(engine_.streams_cut, 1u);
  while (gate_->in_flight() != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(gate_->in_flight(), 0u) << "the request's ticket is released";
}

TEST_F(SidecarTest, EngineDownIs503) {
  StartSidecar();
  Serve(1);
  engine_.delay_ms = 30;
  // Killed once the stream has begun (the client holds its first event).
  std::promise<void> begun;
  std::thread killer([&] {
    begun.get_future().wait();
    engine_.Stop();
  });
  bool first = true;
  Reply cut =
      client_->Send("POST", "/v1/completions", R"({"prompt":"p","stream":true,"max_tokens":1000})",
                    {}, [&](std::string_view) {
                      if (std::exchange(first, false)) begun.set_value();
                      return true;
                    });
  if (first) begun.set_value();  // no stream at all: the assertions below say so
  killer.join();
  auto events = Events(cut.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["error"]["type"], "EngineUnavailable") << cut.body;
  Reply down = client_->Post("/v1/completions", {{"prompt", "p"}});
  EXPECT_EQ(down.status, 503);
  EXPECT_EQ(down.json()["error"]["type"], "EngineUnavailable");
  EXPECT_EQ(down.json()["error"]["retryable"], true);
  EXPECT_EQ(down.header("Retry-After"), "1");
  EXPECT_EQ(client_->Send("GET", "/v1/models").status, 503);
  EXPECT_EQ(InFlightSettled(), 0u);
}

TEST_F(SidecarTest, ControlRoutesNeedTheAdminToken) {
  StartSidecar();
  Serve(1);
  for (const char* path : {"/pause", "//pause", "/v1/../pause/", "/update_weights_from_disk",
                           "/v1/load_lora_adapter"}) {
    Reply r = client_->Send("POST", path, "{}");
    EXPECT_EQ(r.status, 403) << path;
    EXPECT_EQ(r.json()["error"]["type"], "RouteBlocked") << path;
  }
  EXPECT_EQ(client_->Send("POST", "/pause", "{}", {{"X-Tern-Admin-Token", "wrong"}}).status, 403);
  EXPECT_TRUE(engine_.routes_seen().empty());
  Reply admin = client_->Send("POST", "/pause", "{}", {{"X-Tern-Admin-Token", "sekrit"}});
  EXPECT_EQ(admin.status, 200);
  EXPECT_EQ(engine_.routes_seen(), std::vector<std::string>{"/pause"});
  Reply models = client_->Send("GET", "/v1/models");
  EXPECT_EQ(models.json()["data"][0]["id"], "fake");
}

TEST_F(SidecarTest, BehindButReachableWaitsForTheCatchUp) {
  StartSidecar();
  Serve(3);
  // Version 4 is unknown to the member: refused at once (it is not among
  // the catch-up waits counted at the end).
  Json min4 = {{"prompt", "p"},
               {"weight_version", {{"min_version", 4}, {"exact_version", nullptr}}}};
  EXPECT_EQ(client_->Post("/v1/completions", min4).status, 409);
  gate_->SetHead(4);
  std::thread committer([&] {
    std::this_thread::sleep_for(80ms);
    Serve(4);
  });
  Reply r = client_->Post("/v1/completions", min4);
  committer.join();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["weight_version_start"], 4);
  // tern's headers: at most 0 behind head 5 (known, never applied): waits
  // its 300 ms, then 409.
  gate_->SetHead(5);
  Reply stale =
      client_->Post("/v1/completions", {{"prompt", "p"}}, {{"X-Tern-Max-Staleness", "0"}});
  EXPECT_EQ(stale.status, 409);
  EXPECT_EQ(stale.json()["target_version"], 5);
  EXPECT_NE(client_->Send("GET", "/metrics").body.find("tern_sidecar_catchup_waits_total 2"),
            std::string::npos);
}

// A supersede withdrew the member's number (docs/agent/board.md §4a): its
// signed HEAD is of a later epoch and it reports itself stale,
// "superseded". Its applied 1000000 must not satisfy min_version 101: 409
// WeightVersionNotReady, retryable, until it re-bases; requests without a
// version constraint are served.
TEST_F(SidecarTest, ASupersededMemberDoesNotLetAWithdrawnNumberSatisfyAVersion) {
  auto superseded = std::make_shared<std::atomic<bool>>(false);
  auto state = [superseded] {
    ReplicaState r;
    r.member_stale = superseded->load();
    r.stale_reason = "superseded";
    return r;
  };
  StartSidecar(CommitMode::kInPlace, state);
  Serve(1000000);
  const Json min101 = {{"prompt", "p"}, {"weight_version", {{"min_version", 101}}}};
  EXPECT_EQ(client_->Post("/v1/completions", min101).status, 200);
  superseded->store(true);
  Reply r = client_->Post("/v1/completions", min101);
  ASSERT_EQ(r.status, 409) << r.body;
  EXPECT_EQ(r.json()["type"], "WeightVersionNotReady");
  EXPECT_EQ(r.json()["target_version"], 101);
  EXPECT_EQ(r.json()["applied"], 1000000);
  EXPECT_EQ(r.header("Retry-After"), "1");
  EXPECT_EQ(client_->Post("/v1/completions", {{"prompt", "p"}}).status, 200)
      << "no version asked for";
  EXPECT_NE(client_->Send("GET", "/metrics").body.find(
                "tern_sidecar_refusals_total{reason=\"superseded\"} 1"),
            std::string::npos);
  superseded->store(false);
  EXPECT_EQ(client_->Post("/v1/completions", min101).status, 200);
}

// A member cut off from the root reports itself stale (docs/security.md
// "Freshness"); its own HEAD may be old, so X-Tern-Max-Staleness alone
// would pass. Requests that bound their staleness get a retryable 503, the
// rest are served unless --refuse-when-stale.
TEST_F(SidecarTest, AStaleMemberRefusesRequestsThatNeedFreshVersions) {
  auto stale = std::make_shared<std::atomic<bool>>(false);
  auto state = [stale] {
    ReplicaState r;
    r.member_stale = stale->load();
    r.stale_reason = "cut off";
    return r;
  };
  StartSidecar(CommitMode::kInPlace, state);
  Serve(3);
  const Json body = {{"prompt", "p"}};
  EXPECT_EQ(client_->Post("/v1/completions", body, {{"X-Tern-Max-Staleness", "0"}}).status, 200);
  stale->store(true);
  Reply r = client_->Post("/v1/completions", body, {{"X-Tern-Max-Staleness", "5"}});
  ASSERT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.json()["error"]["type"], "MemberStale");
  EXPECT_EQ(r.json()["error"]["retryable"], true);
  EXPECT_NE(r.body.find("cut off"), std::string::npos) << r.body;
  EXPECT_EQ(r.header("Retry-After"), "1");
  EXPECT_EQ(r.header("X-Tern-Version"), "");
  EXPECT_EQ(client_->Post("/v1/completions", body).status, 200) << "no bound asked for";
  const Json info = Json::parse(client_->Send("GET", "/server_info").body);
  EXPECT_EQ(info["member_stale"], true);
  EXPECT_EQ(info["stale_reason"], "cut off");
  EXPECT_NE(client_->Send("GET", "/metrics").body.find(
                "tern_sidecar_refusals_total{reason=\"stale\"} 1"),
            std::string::npos);
  stale->store(false);
  EXPECT_EQ(client_->Post("/v1/completions", body, {{"X-Tern-Max-Staleness", "5"}}).status, 200);

  sidecar_->Stop();
  stale->store(true);
  StartSidecar(CommitMode::kInPlace, state, /*refuse_when_stale=*/true);
  Serve(3);
  EXPECT_EQ(client_->Post("/v1/completions", body).status, 503);
  stale->store(false);
  EXPECT_EQ(client_->Post("/v1/completions", body).status, 200);
}

TEST(MemberStatus, FreshnessIsReadWhenPresentAndCheckedForType) {
  auto v = ParseMemberStatus(
      R"({"served_version": 2, "head": 3, "freshness": {"stale": true, "stale_reason": "behind"}})");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->stale);
  EXPECT_EQ(v->stale_reason, "behind");
  v = ParseMemberStatus(R"({"served_version": 2, "head": 3, "freshness": {"incarnation": 5}})");
  ASSERT_TRUE(v.ok());  // a root's: no "stale"
  EXPECT_FALSE(v->stale);
  EXPECT_FALSE(ParseMemberStatus(R"({"served_version": 2, "head": 3})")->stale);
  EXPECT_EQ(ParseMemberStatus(R"({"served_version": 2, "head": 3, "freshness": {"stale": 1}})")
                .status()
                .code(),
            Code::kCorrupt);
  EXPECT_EQ(ParseMemberStatus(R"({"served_version": 2, "head": 3, "freshness": []})").status().code(),
            Code::kCorrupt);
}

TEST(MemberStatus, TheEnginesVersionIsTheServedOneWhenTheMemberDrivesIt) {
  auto v = ParseMemberStatus(
      R"({"served_version": 7, "head": 7, "engine": {"version": 6, "state": "updating"}})");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->served, 6u);
  EXPECT_TRUE(v->engine);
  v = ParseMemberStatus(R"({"served_version": 7, "head": 7, "engine": {"version": 0}})");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->served, 0u);  // the engine names no version yet: nothing served
  EXPECT_EQ(ParseMemberStatus(R"({"served_version": 7, "head": 7, "engine": {"version": -1}})")
                .status()
                .code(),
            Code::kCorrupt);
  EXPECT_EQ(ParseMemberStatus(R"({"served_version": 7, "head": 7, "engine": 6})").status().code(),
            Code::kCorrupt);
  EXPECT_FALSE(ParseMemberStatus(R"({"served_version": 7, "head": 7})")->engine);
}

TEST(MemberStatus, EpochsAreReadWhenPresentAndTellAWithdrawnNumber) {
  auto v = ParseMemberStatus(
      R"({"served_version": 1000000, "head": 3, "head_epoch": 1, "served_epoch": 0})");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->head_epoch, 1u);
  EXPECT_EQ(v->served_epoch, 0u);
  EXPECT_TRUE(v->superseded());
  v = ParseMemberStatus(R"({"served_version": 3, "head": 3, "head_epoch": 1, "served_epoch": 1})");
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->superseded());
  EXPECT_FALSE(ParseMemberStatus(R"({"served_version": 7, "head": 9})")->superseded())
      << "a member from before epochs: epoch 0 throughout";
  // Driving its engine: the member re-based, its engine still serves the
  // withdrawn number, above HEAD's (no version of HEAD's epoch can be).
  v = ParseMemberStatus(R"({"served_version": 3, "head": 3, "head_epoch": 1, "served_epoch": 1,
                            "engine": {"version": 1000000}})");
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->superseded());
  // ... or a withdrawn number below HEAD's (the new epoch went past it):
  // only the engine's epoch tells it from a version that merely lags.
  v = ParseMemberStatus(R"({"served_version": 3000, "head": 3000, "head_epoch": 1, "served_epoch": 1,
                            "engine": {"version": 2500, "epoch": 0}})");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->served_epoch, 0u);
  EXPECT_TRUE(v->superseded());
  v = ParseMemberStatus(R"({"served_version": 3000, "head": 3000, "head_epoch": 1, "served_epoch": 1,
                            "engine": {"version": 2500, "epoch": 1}})");
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->superseded()) << "a lagging engine of HEAD's epoch";
  for (const char* bad : {R"({"served_version": 3, "head": 3, "head_epoch": -1})",
                          R"({"served_version": 3, "head": 3, "engine": {"version": 3, "epoch": -1}})",
                          R"({"served_version": 3, "head": 3, "engine": {"version": 3, "epoch": 4294967296}})",
                          R"({"served_version": 3, "head": 3, "served_epoch": "1"})",
                          R"({"served_version": 3, "head": 3, "head_epoch": 4294967296})"})
    EXPECT_EQ(ParseMemberStatus(bad).status().code(), Code::kCorrupt) << bad;
}

// The whole service (follower, gate, proxy) against a member's /status: a
// supersede renumbered HEAD below the withdrawn 1000000 the member still
// serves (served_epoch 0 < head_epoch 1) while its freshness says nothing
// of it (its beacon is late, say). The bare numbers would admit
// min_version 101; the epochs refuse it (409, retryable) and /server_info
// says superseded, until the member re-bases; then the staleness floor
// follows the new HEAD, not the withdrawn number.
TEST(SidecarService, RefusesVersionedRequestsWhileTheServedEpochIsBelowHeads) {
  FakeEngine engine;
  std::atomic<uint64_t> served{1000000}, head{1000000};
  std::atomic<uint32_t> served_epoch{0}, head_epoch{0};
  AdminOptions ao;
  ao.address = "127.0.0.1:0";
  auto member = AdminServer::Start(
      ao, {{"GET", "/status",
            [&](const AdminRequest&) {
              return AdminResponse{200, "application/json",
                                   Json{{"role", "member"},
                                        {"served_version", served.load()},
                                        {"head", head.load()},
                                        {"served_epoch", served_epoch.load()},
                                        {"head_epoch", head_epoch.load()},
                                        {"freshness", {{"stale", false}, {"stale_reason", ""}}}}
                                       .dump()};
            },
            /*mutating=*/false}});
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  SidecarConfig c;
  c.listen = "127.0.0.1:0";
  c.engine_url = engine.url();
  c.agent_admin = (*member)->address();
  c.poll_ms = 10;
  c.catchup_wait_ms = 200;
  c.log = [](std::string_view) {};
  auto service = SidecarService::Start(c);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  auto client_owner = std::make_unique<Client>((*service)->address());
  Client& client = *client_owner;
  auto wait_for = [&](auto pred) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!pred() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    return pred();
  };
  auto info = [&] { return Json::parse(client.Send("GET", "/server_info").body, nullptr, false); };
  const Json min101 = {{"prompt", "p"}, {"weight_version", {{"min_version", 101}}}};
  ASSERT_TRUE(wait_for([&] { return info()["applied_version"] == 1000000; }));
  EXPECT_EQ(client.Post("/v1/completions", min101).status, 200);
  EXPECT_EQ(info()["superseded"], false);

  head = 3, head_epoch = 1;  // the supersede: the member has not re-based yet
  ASSERT_TRUE(wait_for([&] { return info()["superseded"] == true; }));
  Reply r = client.Post("/v1/completions", min101);
  ASSERT_EQ(r.status, 409) << r.body;
  EXPECT_EQ(r.json()["type"], "WeightVersionNotReady");
  EXPECT_EQ(r.json()["applied"], 1000000);
  EXPECT_EQ(r.header("Retry-After"), "1");
  EXPECT_EQ(client.Post("/v1/completions", min101, {{"X-Tern-Min-Version", "5"}}).status, 409);
  EXPECT_EQ(client.Post("/v1/completions", {{"prompt", "p"}}).status, 200)
      << "no version asked for";

  served = 3, served_epoch = 1;  // re-based
  ASSERT_TRUE(wait_for([&] { return info()["applied_version"] == 3; }));
  EXPECT_EQ(info()["superseded"], false);
  EXPECT_EQ(info()["head_version"], 3) << "HEAD follows the new epoch down";
  EXPECT_EQ(info()["sync_state"], "IDLE");
  EXPECT_EQ(client.Post("/v1/completions", min101).status, 409) << "3 < 101 now, by number";
  r = client.Post("/v1/completions", {{"prompt", "p"}, {"weight_version", {{"min_version", 2}}}});
  EXPECT_EQ(r.status, 200) << r.body;
  r = client.Post("/v1/completions", {{"prompt", "p"}}, {{"X-Tern-Max-Staleness", "0"}});
  EXPECT_EQ(r.status, 200) << "the floor is HEAD 3, not the withdrawn 1000000: " << r.body;
  (*service)->Stop();
  (*member)->Stop();
}

// The commit point's routes: the admin token, strict bodies, and a commit
// that holds admission closed until it ends.
TEST_F(SidecarTest, CommitRoutesHoldTheGateForTheEngineDriver) {
  StartSidecar();
  Serve(1);
  const httplib::Headers token{{"X-Tern-Admin-Token", "sekrit"}};
  EXPECT_EQ(client_->Post("/tern/commit/begin", Json{{"version", 2}, {"hold_ms", 5000}}).status,
            403);
  EXPECT_EQ(client_->Post("/tern/commit/begin", Json{{"version", 2}, {"hold_ms", 5000}},
                          {{"X-Tern-Admin-Token", "wrong"}})
                .status,
            403);
  for (const Json& bad : {Json{{"version", 2}}, Json{{"version", 0}, {"hold_ms", 5}},
                          Json{{"version", -2}, {"hold_ms", 5}},
                          Json{{"version", 2}, {"hold_ms", 5}, {"x", 1}}, Json::array()}) {
    EXPECT_EQ(client_->Post("/tern/commit/begin", bad, token).status, 400) << bad.dump();
  }
  EXPECT_EQ(client_->Send("GET", "/tern/commit/begin", "", token).status, 405);
  EXPECT_EQ(client_->Post("/tern/commit/end", Json{{"version", 2}, {"loaded", true}}, token).status,
            409);  // none open
  Reply r = client_->Post("/tern/commit/begin", Json{{"version", 2}, {"hold_ms", 5000}}, token);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["applied"], 1);
  // Admission is closed: a request waits for the commit to end.
  auto waiting = std::async(std::launch::async, [&] {
    Client c(sidecar_->address());
    return c.Post("/v1/completions", Json{{"prompt", "x"}});
  });
  EXPECT_EQ(waiting.wait_for(200ms), std::future_status::timeout);
  engine_.version = 2;  // the driver loads the engine
  r = client_->Post("/tern/commit/end", Json{{"version", 2}, {"loaded", true}}, token);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["applied"], 2);
  Reply served = waiting.get();
  ASSERT_EQ(served.status, 200) << served.body;
  EXPECT_EQ(served.json()["weight_version_start"], 2);
  EXPECT_EQ(served.header("X-Tern-Version"), "2");
  // Not loaded: the version stays.
  ASSERT_EQ(client_->Post("/tern/commit/begin", Json{{"version", 3}, {"hold_ms", 5000}}, token).status,
            200);
  r = client_->Post("/tern/commit/end", Json{{"version", 3}, {"loaded", false}}, token);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["applied"], 2);
}

TEST_F(SidecarTest, FollowsTheMembersStatusAndAVersionFile) {
  StartSidecar();
  std::atomic<uint64_t> served{0}, head{0};
  std::atomic<bool> member_stale{false};
  AdminOptions ao;
  ao.address = "127.0.0.1:0";
  ao.token = "member-token";
  auto member = AdminServer::Start(
      ao, {{"GET", "/status",
            [&](const AdminRequest&) {
              return AdminResponse{
                  200, "application/json",
                  Json{{"role", "member"},
                       {"served_version", served.load()},
                       {"head", head.load()},
                       {"freshness", {{"stale", member_stale.load()}, {"stale_reason", "cut off"}}}}
                      .dump()};
            },
            /*mutating=*/true}});
  ASSERT_TRUE(member.ok());
  FollowerOptions fo;
  fo.agent_admin = (*member)->address();
  fo.admin_token = "member-token";
  fo.poll_ms = 10;
  fo.log = [](std::string_view) {};
  auto follower = VersionFollower::Start(fo, *gate_);
  ASSERT_TRUE(follower.ok());
  auto wait_for = [&](auto pred) {
    const auto deadline = std::chrono::steady_clock::now() + 3s;
    while (!pred() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    return pred();
  };
  EXPECT_TRUE(wait_for([&] { return head == 0 && !gate_->applied(); }));
  served = 2, head = 3;
  EXPECT_TRUE(wait_for([&] { return gate_->applied() == 2u; }));
  EXPECT_EQ(gate_->head(), 3u);
  EXPECT_EQ((*follower)->sync_state(), "FETCHING");
  EXPECT_FALSE((*follower)->member_stale(nullptr));
  member_stale = true;
  std::string why;
  EXPECT_TRUE(wait_for([&] { return (*follower)->member_stale(&why); }));
  EXPECT_EQ(why, "cut off");
  member_stale = false;
  EXPECT_TRUE(wait_for([&] { return !(*follower)->member_stale(nullptr); }));
  (*member)->Stop();
  EXPECT_TRUE(wait_for([&] { return (*follower)->sync_state() == "ERROR"; }));
  EXPECT_TRUE((*follower)->member_stale(&why)) << "an unreadable member cannot show it is fresh";
  EXPECT_EQ(gate_->applied(), 2u) << "a failed poll keeps the version";
  (*follower)->Stop();

  const std::string path = ::testing::TempDir() + "/sidecar_version";
  std::ofstream(path) << "7\n";
  fo.agent_admin.clear();
  fo.version_file = path;
  auto from_file = VersionFollower::Start(fo, *gate_);
  ASSERT_TRUE(from_file.ok());
  EXPECT_TRUE(wait_for([&] { return gate_->applied() == 7u; }));
  EXPECT_FALSE((*from_file)->member_stale(nullptr)) << "a version file says nothing of freshness";
  std::ofstream(path) << "seven";
  EXPECT_TRUE(wait_for([&] { return (*from_file)->sync_state() == "ERROR"; }));
  EXPECT_EQ(Json::parse(client_->Send("GET", "/server_info").body)["applied"], "weight_v000007");
}

// A member whose admin port requires a client certificate: the follower
// reads its /status only with one the CA signed.
TEST_F(SidecarTest, FollowsAMemberThatRequiresAClientCertificate) {
  StartSidecar();
  const tern::testing::TestPki& pki = tern::testing::TestCerts();
  ASSERT_TRUE(pki.ok) << pki.error;
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  AdminOptions ao;
  ao.address = "127.0.0.1:0";
  ao.tls_cert_pem = slurp(pki.server.cert_file);
  ao.tls_key_pem = slurp(pki.server.key_file);
  ao.tls_client_ca_pem = slurp(pki.server.ca_file);
  auto member = AdminServer::Start(
      ao, {{"GET", "/status", [](const AdminRequest&) {
              return AdminResponse{200, "application/json",
                                   Json{{"role", "member"}, {"served_version", 4}, {"head", 4}}.dump()};
            }}});
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  FollowerOptions fo;
  fo.agent_admin = "https://" + (*member)->address();
  fo.admin_ca_pem = slurp(pki.server.ca_file);
  fo.poll_ms = 10;
  fo.log = [](std::string_view) {};
  auto wait_for = [&](auto pred) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!pred() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    return pred();
  };
  auto without = VersionFollower::Start(fo, *gate_);
  ASSERT_TRUE(without.ok());
  EXPECT_TRUE(wait_for([&] { return (*without)->sync_state() == "ERROR"; }));
  EXPECT_NE((*without)->last_error().find("requires a client certificate"), std::string::npos)
      << (*without)->last_error();
  EXPECT_FALSE(gate_->applied()) << "nothing read, nothing applied";
  (*without)->Stop();
  fo.admin_cert_pem = slurp(pki.client.cert_file);
  fo.admin_key_pem = slurp(pki.client.key_file);
  auto with = VersionFollower::Start(fo, *gate_);
  ASSERT_TRUE(with.ok());
  EXPECT_TRUE(wait_for([&] { return gate_->applied() == 4u; }));
  (*with)->Stop();
}

// The invariant: every response's stated version is inside the request's
// accepted range and is the version that generated it, with 40 clients
// (streaming and not, mixed constraints) across a series of commits.
class SidecarInvariant : public SidecarTest, public ::testing::WithParamInterface<CommitMode> {};

TEST_P(SidecarInvariant, NoResponseOutsideItsRangeOrMislabelled) {
  StartSidecar(GetParam());
  Serve(1);
  engine_.delay_ms = 2;
  constexpr int kClients = 40, kRequestsEach = 12;
  constexpr uint64_t kLastVersion = 12;
  std::atomic<bool> stop{false};
  std::atomic<int> served{0}, refused{0}, streamed{0};
  std::vector<std::string> violations;
  std::mutex violations_mu;
  auto violation = [&](std::string what) {
    std::lock_guard<std::mutex> lock(violations_mu);
    violations.push_back(std::move(what));
  };
  std::thread committer([&] {
    for (uint64_t v = 2; v <= kLastVersion && !stop; ++v) {
      gate_->SetHead(v);  // known first, so that floors at v can wait for it
      std::this_thread::sleep_for(15ms);
      Status s = gate_->Commit(
          v,
          [&] {
            engine_.version = v;
            return Status::Ok();
          },
          5000);
      if (!s.ok()) violation("commit " + std::to_string(v) + ": " + s.ToString());
      std::this_thread::sleep_for(15ms);
    }
  });
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      Client client(sidecar_->address());
      std::mt19937 rng(c);
      for (int i = 0; i < kRequestsEach; ++i) {
        const uint64_t now = gate_->applied().value_or(1);
        VersionConstraint want;
        switch (rng() % 4) {
          case 0:
            break;
          case 1:
            want.min_version = now > 1 ? now - rng() % 2 : 1;
            break;
          case 2:
            want.exact_version = now;
            break;
          case 3:
            want.min_version = now + 1;
            break;
        }
        const bool stream = rng() % 2;
        const char* path = (rng() % 3 == 0)
                               ? "/generate"
                               : (rng() % 2 ? "/v1/completions" : "/v1/chat/completions");
        Json body = {{"prompt", "p"}, {"stream", stream}, {"max_tokens", 3}};
        body["weight_version"] = {
            {"min_version", want.min_version ? Json(*want.min_version) : Json(nullptr)},
            {"exact_version", want.exact_version ? Json(*want.exact_version) : Json(nullptr)}};
        Reply r = client.Post(path, body);
        const std::string what =
            std::string(path) + " " + want.ToString() + (stream ? " stream" : "") + ": ";
        if (r.status == 409) {
          ++refused;
          if (r.json()["type"] != "WeightVersionNotReady") violation(what + "409 " + r.body);
          continue;
        }
        if (r.status != 200) {
          violation(what + "status " + std::to_string(r.status) + " " + r.error + " " + r.body);
          continue;
        }
        ++served;
        const uint64_t start = std::stoull(r.header("X-Tern-Version"));
        if (!want.SatisfiedBy(start)) violation(what + "started on " + std::to_string(start));
        auto check = [&](const Json& stamps, uint64_t engine_first, uint64_t engine_last) {
          const uint64_t s = stamps.value("weight_version_start", uint64_t{0});
          const uint64_t e = stamps.value("weight_version_end", uint64_t{0});
          if (s != start || e < s || engine_first < s || engine_last > e ||
              engine_first > engine_last || (want.exact_version && e != *want.exact_version))
            violation(what + "stamped " + std::to_string(s) + ".." + std::to_string(e) +
                      ", engine ran " + std::to_string(engine_first) + ".." +
                      std::to_string(engine_last));
        };
        const bool generate = std::string(path) == "/generate";
        if (stream) {
          ++streamed;
          bool done = false;
          auto events = Events(r.body, &done);
          if (!done || events.size() != 3) violation(what + "stream " + r.body);
          for (const auto& e : events) {
            const Json& stamps = generate ? e["meta_info"] : e;
            const uint64_t v = stamps.value("engine_version", uint64_t{0});
            check(stamps, v, v);
          }
        } else {
          Json j = r.json();
          const Json& stamps = generate ? j["meta_info"] : j;
          check(stamps, stamps.value("engine_version_start", uint64_t{0}),
                stamps.value("engine_version_end", uint64_t{0}));
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  stop = true;
  committer.join();
  for (size_t i = 0; i < std::min<size_t>(violations.size(), 10); ++i)
    ADD_FAILURE() << violations[i];
  EXPECT_EQ(violations.size(), 0u);
  EXPECT_EQ(served + refused, kClients * kRequestsEach);
  EXPECT_GT(served, kClients * kRequestsEach / 2);
  EXPECT_GT(streamed, 0);
  EXPECT_EQ(InFlightSettled(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, SidecarInvariant,
                         ::testing::Values(CommitMode::kQuiesce, CommitMode::kInPlace),
                         [](const auto& info) {
                           return info.param == CommitMode::kQuiesce ? "Quiesce" : "InPlace";
                         });

}  // namespace
}  // namespace tern::agent
