// libFuzzer target: one request to the admin port as raw client bytes
// (agent/ops/admin_http.h): a real AdminServer on loopback, started once,
// with the guard in front of httplib, a token, and the three kinds of route
// (public, private read, mutating, with JSON bodies as the daemon's
// routes parse them). Per input: connect, send the bytes, close the write
// side if no answer came within 50 ms (an incomplete request), read the
// answer to its end. Checks:
//  * the answer is nothing (the guard closed) or an HTTP/1.1 status line
//    with a 3-digit code;
//  * a private or mutating route ran only for a request that carried
//    "Bearer <the token>";
//  * the port still serves a well-formed request afterwards (no input
//    wedges it: every refusal leaves the server serving).
// The inputs are the garbage, truncations, oversized heads and bodies, odd
// methods, duplicate headers and chunked bodies a port facing the network
// gets. Seeds: tests/fuzz/corpus/admin_http.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "agent/ops/admin_http.h"

namespace {

using tern::agent::AdminOptions;
using tern::agent::AdminRequest;
using tern::agent::AdminResponse;
using tern::agent::AdminRoute;
using tern::agent::AdminServer;

constexpr std::string_view kToken = "fz-7f3a9c1e5b2d";
std::atomic<int> g_private_calls{0};

AdminResponse Publish(const AdminRequest& req) {
  ++g_private_calls;
  nlohmann::json j = nlohmann::json::parse(req.body, nullptr, false);
  if (!j.is_object() || !j.contains("version") || !j["version"].is_number_unsigned())
    return {400, "text/plain", "expected {\"version\": N}\n"};
  return {200, "application/json", nlohmann::json{{"published", j["version"].get<uint64_t>()}}.dump() + "\n"};
}

AdminServer* Server(uint16_t* port) {
  static uint16_t bound = 0;
  static AdminServer* server = [] {
    AdminOptions o;
    o.address = "127.0.0.1:0";
    o.token = std::string(kToken);
    o.max_body_bytes = 4096;
    o.max_head_bytes = 4096;
    o.request_timeout_ms = 3000;
    o.io_timeout_ms = 1000;
    o.log = [](std::string_view) {};
    std::vector<AdminRoute> routes;
    routes.push_back({"GET", "/status", [](const AdminRequest& r) {
                        return AdminResponse{200, "application/json",
                                             "{\"params\": " + std::to_string(r.params.size()) + "}\n"};
                      }});
    routes.push_back({"GET", "/events",
                      [](const AdminRequest&) {
                        ++g_private_calls;
                        return AdminResponse{200, "application/json", "{\"events\": []}\n"};
                      },
                      /*mutating=*/false, /*private_read=*/true});
    routes.push_back({"POST", "/publish", Publish, /*mutating=*/true});
    auto s = AdminServer::Start(o, std::move(routes));
    if (!s.ok()) {
      fprintf(stderr, "admin fuzzer: %s\n", s.status().ToString().c_str());
      std::abort();
    }
    const std::string a = (*s)->address();
    bound = static_cast<uint16_t>(std::stoi(a.substr(a.rfind(':') + 1)));
    return s->release();  // lives as long as the process
  }();
  *port = bound;
  return server;
}

// Sends `in`, reads to the end (bounded: 64 KiB, 5 s of silence). With
// `half_close`, the write side is closed when no answer came within 50 ms,
// so that an incomplete request ends (httplib answers nothing to a request
// whose client half-closed before the answer: Debian's 0.11; so under load
// a complete request may go unanswered too, which the checks allow).
//
// The harness's own client resources are not findings: a connect that a
// signal interrupted (libFuzzer's -timeout alarm) or that found no free
// local port (thousands of loopback connections in TIME_WAIT, two fuzzers
// at once in the test command) is tried again, up to 2 s; any other
// failure aborts, naming errno (a clean-clone run once aborted here
// without saying why).
int Connect(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int attempt = 0;; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0)
      return fd;
    const int err = errno;
    if (fd >= 0) close(fd);
    const bool transient = err == EINTR || err == EADDRNOTAVAIL || err == EAGAIN;
    if (!transient || attempt >= 200) {
      fprintf(stderr, "admin fuzzer: cannot connect to 127.0.0.1:%u (attempt %d): %s\n",
              unsigned{port}, attempt + 1, strerror(err));
      std::abort();
    }
    usleep(10000);
  }
}

std::string Exchange(uint16_t port, std::string_view in, bool half_close) {
  const int fd = Connect(port);
  size_t sent = 0;
  while (sent < in.size()) {
    const ssize_t n = send(fd, in.data() + sent, in.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the guard closed (over a bound): read what it said
    sent += static_cast<size_t>(n);
  }
  pollfd first{fd, POLLIN, 0};
  if (half_close && poll(&first, 1, 50) == 0) shutdown(fd, SHUT_WR);
  std::string out;
  char buf[4096];
  for (int waits = 0; out.size() < (64u << 10) && waits < 50;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    if (ready <= 0) {  // 100 ms of silence, or a signal: bounded either way
      ++waits;
      continue;
    }
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

bool StatusLine(std::string_view answer) {
  if (answer.empty()) return true;
  if (answer.size() < 12 || answer.substr(0, 9) != "HTTP/1.1 ") return false;
  for (size_t i = 9; i < 12; ++i)
    if (answer[i] < '0' || answer[i] > '9') return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (16u << 10)) return 0;
  uint16_t port = 0;
  Server(&port);
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  g_private_calls = 0;
  const std::string answer = Exchange(port, in, /*half_close=*/true);
  if (!StatusLine(answer)) {
    fprintf(stderr, "admin fuzzer: not an HTTP answer: %.80s\n", answer.c_str());
    std::abort();
  }
  if (g_private_calls > 0 && in.find("Bearer " + std::string(kToken)) == std::string_view::npos) {
    fprintf(stderr, "admin fuzzer: a private route ran without the token\n");
    std::abort();
  }
  const std::string ok = Exchange(port, "GET /status HTTP/1.1\r\nHost: x\r\n\r\n", /*half_close=*/false);
  if (ok.rfind("HTTP/1.1 200", 0) != 0) {
    fprintf(stderr, "admin fuzzer: the port stopped serving: %.80s\n", ok.c_str());
    std::abort();
  }
  return 0;
}
