#include "agent/ops/admin_http.h"

#include <dirent.h>
#include <fcntl.h>
#include <httplib.h>
#include <openssl/err.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "agent/https/https_tls.h"
#include "agent/ops/admin_guard.h"
#include "base/mutex.h"
#include "base/text.h"

namespace tern::agent {
namespace {

using namespace std::chrono_literals;

// Route paths are plain so that they can be regex patterns for httplib
// without surprises: '/' then [A-Za-z0-9_./-].
bool ValidRoutePath(std::string_view p) {
  if (p.empty() || p[0] != '/' || p.size() > 200) return false;
  for (char c : p) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '/' ||
          c == '_' || c == '.' || c == '-')) {
      return false;
    }
  }
  return true;
}

// A route path, then optionally a query of plain characters
// ("/events?after=3&timeout_ms=5000"): what the client sends.
bool ValidRequestPath(std::string_view p) {
  const size_t q = p.find('?');
  if (!ValidRoutePath(p.substr(0, q))) return false;
  if (q == std::string_view::npos) return true;
  if (p.size() > 1000) return false;
  for (char c : p.substr(q + 1)) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '.' || c == '-' || c == '=' || c == '&' || c == '%')) {
      return false;
    }
  }
  return true;
}

std::string RegexOf(std::string_view path) {
  std::string out;
  for (char c : path) {
    if (c == '.') out += '\\';
    out += c;
  }
  return out;
}

bool TokenMatches(const std::string& header, const std::string& token) {
  return SecretEquals("Bearer " + token, header);
}

// httplib 0.11 does not export its reason table.
const char* Reason(int status) {
  switch (status) {
    case 400:
      return "bad request (not HTTP/1.x this server can parse)";
    case 404:
      return "no such route";
    case 405:
      return "method not allowed";
    case 411:
      return "length required";
    case 413:
      return "payload too large";
    case 415:
      return "unsupported media type";
    case 414:
      return "URI too long";
    case 416:
      return "range not satisfiable";
    default:
      return "refused";
  }
}

void SetText(httplib::Response& res, int status, std::string_view why) {
  res.status = status;
  res.set_content("admin: " + std::string(why) + "\n", "text/plain");
}

// A Content-Length as RFC 9110 has it: digits only. nullopt: malformed.
std::optional<uint64_t> ParseContentLength(const std::string& v) {
  if (v.empty() || v.size() > 18) return std::nullopt;
  uint64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  return n;
}

// The private socket's directories that a killed agent left in `dir`
// (SIGKILL runs no destructor): ours (same owner, 0700, named as mkdtemp
// makes them), whose socket nobody listens on (a connect refused at once),
// and older than kStaleSocketDirS by the file system's clock (`fs_now`: the
// mtime of the directory this start just made), so that a process whose
// clock is skewed cannot take another agent's socket for dead between its
// bind and its listen. A directory without a socket is left alone (its
// agent may be between mkdtemp and bind). Everything is reached through
// directory descriptors opened without following links, and the connect
// through /proc/self/fd, so a link swapped into a shared, non-sticky
// directory leads nowhere; the connect is non-blocking, so a live agent
// that does not accept (stopped, wedged, its backlog full) is left alone
// without a wait. At most kMaxSocketDirsScanned directories named so are
// looked at per start. Returns how many were removed.
constexpr int64_t kStaleSocketDirS = 60;
constexpr uint32_t kMaxSocketDirsScanned = 256;

// Whether nobody listens on the socket `name` in directory `dir_fd`.
bool NobodyListens(int dir_fd, const char* name) {
  const std::string path = "/proc/self/fd/" + std::to_string(dir_fd) + "/" + name;
  sockaddr_un a{};
  if (path.size() >= sizeof a.sun_path) return false;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  const bool refused =
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno == ECONNREFUSED;
  ::close(fd);
  return refused;
}

uint32_t SweepStaleSocketDirs(const std::string& dir, int64_t fs_now) {
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return 0;
  const int list_fd = ::dup(dir_fd);
  DIR* d = list_fd >= 0 ? ::fdopendir(list_fd) : nullptr;
  if (d == nullptr) {
    if (list_fd >= 0) ::close(list_fd);
    ::close(dir_fd);
    return 0;
  }
  uint32_t removed = 0, looked = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name.size() != 17 || name.substr(0, 11) != "tern-admin-") continue;
    if (++looked > kMaxSocketDirsScanned) break;
    const int sub = ::openat(dir_fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) continue;
    struct stat st, sock;
    const bool stale =
        ::fstat(sub, &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 07777) == 0700 &&
        fs_now - static_cast<int64_t>(st.st_mtime) >= kStaleSocketDirS &&
        ::fstatat(sub, "http.sock", &sock, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(sock.st_mode) &&
        sock.st_uid == ::geteuid() && NobodyListens(sub, "http.sock");
    const bool emptied = stale && ::unlinkat(sub, "http.sock", 0) == 0;
    ::close(sub);
    if (emptied && ::unlinkat(dir_fd, e->d_name, AT_REMOVEDIR) == 0) ++removed;
  }
  ::closedir(d);
  ::close(dir_fd);
  return removed;
}

struct RouteEntry {
  AdminRoute route;
  uint32_t body_limit = 0;  // POST; 0 for GET
  bool large = false;       // over AdminOptions::max_body_bytes
};

}  // namespace

struct AdminServer::Impl {
  AdminOptions options;
  // (method, path) -> route; GET also answers HEAD, as httplib does.
  std::map<std::pair<std::string, std::string>, RouteEntry> routes;
  std::set<std::string> paths;

  std::atomic<uint64_t> body_bytes{0}, refused_from_head{0};
  Mutex large_mu;
  CondVar large_cv{&large_mu};
  uint32_t large_in_use GUARDED_BY(large_mu) = 0;
  uint32_t large_peak GUARDED_BY(large_mu) = 0;
  bool stopping GUARDED_BY(large_mu) = false;

  // The head alone decides (docs in the header): nullptr with `res` set to
  // the refusal, or the route.
  const RouteEntry* CheckHead(const httplib::Request& req, httplib::Response& res);
  // A slot for a large body: false after waiting `wait_ms`, or at Stop.
  bool AcquireLarge(uint32_t wait_ms);
  void ReleaseLarge();
  void HandlePost(const RouteEntry& e, const httplib::Request& req, httplib::Response& res,
                  const httplib::ContentReader& reader);
  void Answer(const RouteEntry& e, const httplib::Request& req, std::string_view body,
              httplib::Response& res) const;
  std::string bound_address;
  std::string socket_dir, socket_path;
  std::unique_ptr<httplib::Server> server;  // httplib::SSLServer with TLS
  std::thread http_thread;
  std::unique_ptr<AdminGuard> guard;
  std::once_flag stop_once;

  void StopAll() {
    {
      MutexLock lock(large_mu);
      stopping = true;
    }
    large_cv.SignalAll();
    if (guard) guard->Stop();
    if (http_thread.joinable()) {
      server->stop();
      http_thread.join();  // httplib joins its workers: handlers in flight are done
    }
    if (!socket_path.empty()) ::unlink(socket_path.c_str());
    if (!socket_dir.empty()) ::rmdir(socket_dir.c_str());
  }
};

const RouteEntry* AdminServer::Impl::CheckHead(const httplib::Request& req,
                                               httplib::Response& res) {
  auto refuse = [&](int status, std::string why) -> const RouteEntry* {
    SetText(res, status, std::to_string(status) + " " + Reason(status) + ": " + why);
    ++refused_from_head;
    return nullptr;
  };
  const std::string method = req.method == "HEAD" ? "GET" : req.method;
  auto it = routes.find({method, req.path});
  if (it == routes.end()) {
    if (paths.count(req.path) == 0) return refuse(404, Printable(req.path.substr(0, 200)));
    const bool get = routes.count({"GET", req.path}) > 0;
    return refuse(404, Printable(req.method.substr(0, 16)) + " " + req.path +
                           " (this route takes " + (get ? "GET" : "POST") + ")");
  }
  const RouteEntry& e = it->second;
  if ((e.route.mutating || e.route.private_read) && !options.token.empty() &&
      !TokenMatches(req.get_header_value("Authorization"), options.token)) {
    res.set_header("WWW-Authenticate", "Bearer");
    SetText(res, 401, "missing or wrong bearer token");
    ++refused_from_head;
    return nullptr;
  }
  const bool has_length = req.has_header("Content-Length");
  const bool has_te = req.has_header("Transfer-Encoding");
  std::optional<uint64_t> length;
  if (has_length) {
    // Two Content-Length headers, or one httplib and a proxy could read
    // differently, is how requests get smuggled.
    if (req.get_header_value_count("Content-Length") != 1 ||
        !(length = ParseContentLength(req.get_header_value("Content-Length")))) {
      return refuse(400, "malformed Content-Length");
    }
  }
  if (has_te && (has_length || req.get_header_value_count("Transfer-Encoding") != 1 ||
                 strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") != 0)) {
    return refuse(400, "Transfer-Encoding must be chunked alone, without Content-Length");
  }
  if (req.has_header("Content-Encoding") &&
      strcasecmp(req.get_header_value("Content-Encoding").c_str(), "identity") != 0) {
    return refuse(415, "compressed bodies (Content-Encoding) are not accepted");
  }
  if (e.route.method == "GET") {
    if (has_te || (length && *length > 0)) return refuse(400, "a GET takes no body");
    return &e;
  }
  if (!has_length && !has_te) {
    return refuse(411, "a POST needs Content-Length (or chunked framing)");
  }
  if (length && *length > e.body_limit) {
    return refuse(413, "a body of " + std::to_string(*length) +
                           " bytes is over this route's limit of " + std::to_string(e.body_limit) +
                           " bytes");
  }
  return &e;
}

bool AdminServer::Impl::AcquireLarge(uint32_t wait_ms) {
  MutexLock lock(large_mu);
  const bool got =
      large_cv.WaitUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms),
                         [&]() NO_THREAD_SAFETY_ANALYSIS {
                           return stopping || large_in_use < options.max_large_bodies;
                         });
  if (!got || stopping) return false;
  ++large_in_use;
  large_peak = std::max(large_peak, large_in_use);
  return true;
}

void AdminServer::Impl::ReleaseLarge() {
  {
    MutexLock lock(large_mu);
    --large_in_use;
  }
  large_cv.Signal();
}

void AdminServer::Impl::Answer(const RouteEntry& e, const httplib::Request& req,
                               std::string_view body, httplib::Response& res) const {
  AdminRequest ar{req.method, req.path, body, {}};
  // The first value of each query parameter, at most kMaxQueryParams.
  for (const auto& [k, v] : req.params) {
    if (ar.params.size() >= kMaxQueryParams) break;
    ar.params.emplace(k, v);
  }
  AdminResponse out = e.route.handler(ar);
  res.status = out.status;
  res.set_content(std::move(out.body), out.content_type.c_str());
}

void AdminServer::Impl::HandlePost(const RouteEntry& e, const httplib::Request& req,
                                   httplib::Response& res, const httplib::ContentReader& reader) {
  // The pre-routing handler checked the head; a body is read only now.
  // The slot bounds bodies being read; once read, a body is held by its
  // handler on this worker thread (at most `workers` at once), and a
  // handler may wait (a rank part waits for the other ranks' parts), so
  // the slot is not held through it.
  struct Slot {
    Impl* impl = nullptr;
    void Release() {
      if (impl) impl->ReleaseLarge();
      impl = nullptr;
    }
    ~Slot() { Release(); }
  } slot;
  if (e.large) {
    if (!AcquireLarge(options.request_timeout_ms / 2)) {
      res.set_header("Retry-After", "1");
      return SetText(res, 503,
                     "busy: " + std::to_string(options.max_large_bodies) +
                         " large bodies are being read; try again");
    }
    slot.impl = this;
  }
  std::string body;
  if (auto n = ParseContentLength(req.get_header_value("Content-Length"))) {
    body.reserve(std::min<uint64_t>(e.body_limit, *n));
  }
  bool over = false;
  const bool whole = reader([&](const char* data, size_t n) {
    if (n > e.body_limit - body.size()) return !(over = true);
    body.append(data, n);
    return true;
  });
  slot.Release();
  body_bytes += body.size();
  if (over) {
    return SetText(res, 413,
                   "413 " + std::string(Reason(413)) + ": the body is over this route's limit of " +
                       std::to_string(e.body_limit) + " bytes");
  }
  if (!whole) return SetText(res, 400, "the request body did not arrive whole");
  Answer(e, req, body, res);
}

Result<std::unique_ptr<AdminServer>> AdminServer::Start(AdminOptions options,
                                                        std::vector<AdminRoute> routes) {
  auto hp = ParseHostPort(options.address);
  if (!hp.ok()) return hp.status();
  TERN_REQUIRE(options.max_connections >= 1 && options.max_connections <= 1024, kInvalidArgument,
               "admin: max_connections must be 1..1024");
  TERN_REQUIRE(options.workers >= 1 && options.workers <= 64, kInvalidArgument,
               "admin: workers must be 1..64");
  TERN_REQUIRE(options.max_head_bytes >= 1024 && options.request_timeout_ms >= 1 &&
                   options.io_timeout_ms >= 1,
               kInvalidArgument, "admin: max_head_bytes >= 1024 and timeouts > 0 required");
  TERN_REQUIRE(options.token.size() <= 1024 && IsPrintable(options.token) &&
                   options.token.find(' ') == std::string::npos,
               kInvalidArgument, "admin: token must be printable ASCII without spaces");
  TERN_REQUIRE(options.tls_cert_pem.empty() == options.tls_key_pem.empty(), kInvalidArgument,
               "admin: give both a TLS certificate (--admin-tls-cert) and its key "
               "(--admin-tls-key), or neither");
  const bool tls = !options.tls_cert_pem.empty();
  TERN_REQUIRE(
      tls || options.tls_client_ca_pem.empty(), kInvalidArgument,
      "admin: a client CA (--admin-tls-client-ca) needs TLS on the port (--admin-tls-cert, "
      "--admin-tls-key)");
  std::set<std::pair<std::string, std::string>> seen;
  for (const auto& r : routes) {
    TERN_REQUIRE(r.method == "GET" || r.method == "POST", kInvalidArgument,
                 "admin: route method must be GET or POST, not ", Printable(r.method));
    TERN_REQUIRE(ValidRoutePath(r.path), kInvalidArgument, "admin: bad route path ",
                 Printable(r.path), " (want /[A-Za-z0-9_./-]*)");
    TERN_REQUIRE(r.handler != nullptr, kInvalidArgument, "admin: route ", r.path,
                 " has no handler");
    TERN_REQUIRE(seen.emplace(r.method, r.path).second, kInvalidArgument, "admin: route ", r.method,
                 " ", r.path, " given twice");
    TERN_REQUIRE(r.method == "POST" || r.max_body_bytes == 0, kInvalidArgument, "admin: route GET ",
                 r.path, " takes no body: max_body_bytes must be 0");
    TERN_REQUIRE(r.max_body_bytes <= kMaxAdminBodyBytes, kInvalidArgument, "admin: route ", r.path,
                 ": max_body_bytes over ", kMaxAdminBodyBytes);
  }
  TERN_REQUIRE(options.max_body_bytes <= kMaxAdminBodyBytes, kInvalidArgument,
               "admin: max_body_bytes over ", kMaxAdminBodyBytes);
  TERN_REQUIRE(options.max_large_bodies >= 1 && options.max_large_bodies <= 64, kInvalidArgument,
               "admin: max_large_bodies must be 1..64");
  if (!options.log) options.log = StderrLog();

  auto impl = std::make_unique<Impl>();
  impl->options = options;
  uint32_t largest_body = options.max_body_bytes;
  for (const auto& r : routes) {
    RouteEntry e{r};
    if (r.method == "POST") {
      e.body_limit = r.max_body_bytes != 0 ? r.max_body_bytes : options.max_body_bytes;
      e.large = e.body_limit > options.max_body_bytes;
      largest_body = std::max(largest_body, e.body_limit);
    }
    impl->paths.insert(r.path);
    impl->routes.emplace(std::make_pair(r.method, r.path), std::move(e));
  }
  if (tls) {
    TERN_ASSIGN_OR_RETURN(impl->server, NewHttpsServer(options.tls_cert_pem, options.tls_key_pem,
                                                       {"admin TLS", "--admin-tls-client-ca",
                                                        "--admin-tls-cert", "--admin-tls-key"},
                                                       options.tls_client_ca_pem));
  } else {
    impl->server = std::make_unique<httplib::Server>();
  }
  // The Unix socket lives in a fresh 0700 directory: only this user can
  // reach httplib without going through the guard's bounds.
  std::string dir = options.socket_dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = tmp && *tmp ? tmp : "/tmp";
  }
  std::string templ = dir + "/tern-admin-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return TERN_ERRNO("admin: mkdtemp in ", dir);
  if (struct stat made; ::stat(templ.c_str(), &made) == 0) {
    if (const uint32_t swept = SweepStaleSocketDirs(dir, made.st_mtime); swept > 0) {
      options.log("admin: removed " + std::to_string(swept) + " socket director" +
                  (swept == 1 ? "y" : "ies") + " in " + dir + " that killed agents left");
    }
  }
  impl->socket_dir = templ;
  impl->socket_path = templ + "/http.sock";
  if (impl->socket_path.size() >= 100) {  // sockaddr_un::sun_path is 108 bytes
    impl->StopAll();
    return TERN_ERROR(kInvalidArgument, "admin: unix socket path too long (", impl->socket_path,
                      "): set AdminOptions::socket_dir or TMPDIR to a shorter directory");
  }

  httplib::Server& http = *impl->server;
  // Every httplib limit that can be set at run time is set here; the rest
  // are compiled into Debian's libcpp-httplib0.11 (header line and URI
  // 8192 bytes, listen backlog 5) or bounded by the guard (docs/agent/operations.md).
  // Each route's own limit is checked from the head (CheckHead); this one
  // only keeps httplib's from being lower.
  http.set_payload_max_length(largest_body);
  http.set_read_timeout(std::chrono::milliseconds(options.io_timeout_ms));
  http.set_write_timeout(std::chrono::milliseconds(options.io_timeout_ms));
  http.set_keep_alive_max_count(1);
  http.set_keep_alive_timeout(1);
  const uint32_t workers = options.workers;
  // The queue never holds more than max_connections: the guard relays at
  // most that many connections at once.
  http.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  LogFn log = options.log;
  http.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
        if (res.body.empty()) {
          SetText(res, res.status, std::to_string(res.status) + " " + Reason(res.status));
        }
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler([log](const httplib::Request& req, httplib::Response& res,
                                   std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    log("admin: " + req.method + " " + Printable(req.path) + ": handler threw: " + Printable(what));
    SetText(res, 500, "internal error");
  });
  http.set_logger([log](const httplib::Request& req, const httplib::Response& res) {
    if (res.status >= 400) {
      log("admin: " + std::to_string(res.status) + " for " + Printable(req.method) + " " +
          Printable(req.path.substr(0, 200)));
    }
  });
  Impl* const p = impl.get();  // outlives httplib's threads (StopAll joins them)
  http.set_pre_routing_handler([p](const httplib::Request& req, httplib::Response& res) {
    return p->CheckHead(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                  : httplib::Server::HandlerResponse::Handled;
  });
  // A client that sends "Expect: 100-continue" and waits is refused before
  // it sends its body; httplib's default would say 100 to anything.
  http.set_expect_100_continue_handler([p](const httplib::Request& req, httplib::Response& res) {
    return p->CheckHead(req, res) ? 100 : res.status;
  });
  for (const auto& [key, e] : impl->routes) {
    const RouteEntry* entry = &e;  // the map does not change after this
    if (key.first == "GET") {
      http.Get(RegexOf(key.second),
               [p, entry](const httplib::Request& req, httplib::Response& res) {
                 p->Answer(*entry, req, {}, res);
               });
    } else {
      http.Post(RegexOf(key.second), [p, entry](const httplib::Request& req, httplib::Response& res,
                                                const httplib::ContentReader& reader) {
        p->HandlePost(*entry, req, res, reader);
      });
    }
  }
  http.set_address_family(AF_UNIX);
  if (!http.bind_to_port(impl->socket_path, 80)) {
    impl->StopAll();
    return TERN_ERROR(kIo, "admin: cannot listen on unix socket ", impl->socket_path);
  }
  impl->http_thread = std::thread([p = impl.get()] {
    // OpenSSL writes with write(2): a client gone mid-answer would raise
    // SIGPIPE. Blocked here, and in the workers, which inherit this mask.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    p->server->listen_after_bind();
  });
  // stop() before the loop runs would be lost (httplib checks is_running).
  for (int i = 0; i < 5000 && !impl->server->is_running(); ++i) std::this_thread::sleep_for(1ms);
  if (!impl->server->is_running()) {
    impl->StopAll();
    return TERN_ERROR(kInternal, "admin: http server did not start");
  }

  GuardOptions g;
  g.max_connections = options.max_connections;
  g.max_request_bytes = uint64_t{options.max_head_bytes} + largest_body;
  g.request_timeout_ms = options.request_timeout_ms;
  g.tls = tls;
  g.log = log;
  auto guard = AdminGuard::Start(hp->host, hp->port, impl->socket_path, g);
  if (!guard.ok()) {
    impl->StopAll();
    return guard.status();
  }
  impl->guard = std::move(*guard);
  impl->bound_address = FormatHostPort({hp->host, impl->guard->port()});
  return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

AdminServer::AdminServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AdminServer::~AdminServer() { Stop(); }
std::string AdminServer::address() const { return impl_->bound_address; }
AdminCounters AdminServer::counters() const {
  AdminCounters c;
  c.client_bytes_read = impl_->guard ? impl_->guard->client_bytes_read() : 0;
  c.connections_open = impl_->guard ? impl_->guard->connections_open() : 0;
  c.body_bytes_read = impl_->body_bytes.load();
  c.refused_from_head = impl_->refused_from_head.load();
  MutexLock lock(impl_->large_mu);
  c.large_bodies_peak = impl_->large_peak;
  return c;
}
void AdminServer::Stop() {
  std::call_once(impl_->stop_once, [this] { impl_->StopAll(); });
}

AdminRoute MetricsRoute(std::function<std::string()> render) {
  return AdminRoute{
      "GET", "/metrics",
      [render = std::move(render)](const AdminRequest&) {
        return AdminResponse{200, "text/plain; version=0.0.4; charset=utf-8", render()};
      },
      false};
}

namespace {

// Ends a call at its deadline. httplib bounds each connect, read and write
// on its own (and holds its socket lock through a TLS handshake, so even
// its ClientImpl::stop() waits that out): a server sending its head, or
// its handshake, a byte per read timeout would hold a call for ever. The
// watchdog keeps a duplicate of the call's socket (httplib's socket
// options hook hands it over as soon as it is made) and shuts the
// connection down at the deadline: every read, write and handshake step
// on it then fails at once. The duplicate keeps the descriptor from being
// reused while the watchdog may still shut it down.
class CallWatchdog {
 public:
  explicit CallWatchdog(std::chrono::steady_clock::time_point deadline)
      : thread_([this, deadline] {
          MutexLock lock(mu_);
          if (cv_.WaitUntil(deadline, [this]() REQUIRES(mu_) { return done_; })) return;
          fired_ = true;
          // A socket not made or not connected yet ignores a shutdown
          // (ENOTCONN; httplib bounds the connect by the same timeout):
          // tried again every 20 ms until it takes or the call returns.
          while (fd_ < 0 || ::shutdown(fd_, SHUT_RDWR) != 0) {
            const auto again = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
            if (cv_.WaitUntil(again, [this]() REQUIRES(mu_) { return done_; })) return;
          }
        }) {}
  ~CallWatchdog() {
    {
      MutexLock lock(mu_);
      done_ = true;
    }
    cv_.SignalAll();
    thread_.join();
    MutexLock lock(mu_);
    if (fd_ >= 0) ::close(fd_);
  }
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;

  // For httplib's set_socket_options: called with each socket it makes
  // (one per call: keep-alive is off), before it connects.
  void Watch(int fd) {
    MutexLock lock(mu_);
    if (fd_ >= 0) ::close(fd_);
    fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  }
  // Whether the deadline passed before the call returned.
  bool fired() {
    MutexLock lock(mu_);
    return fired_;
  }

 private:
  Mutex mu_;
  CondVar cv_{&mu_};
  bool done_ GUARDED_BY(mu_) = false;
  bool fired_ GUARDED_BY(mu_) = false;
  int fd_ GUARDED_BY(mu_) = -1;
  std::thread thread_;  // last: started when the rest is ready
};

Result<std::string> AdminCall(const char* method, std::string_view address, std::string_view path,
                              std::string_view body, const AdminClientOptions& options) {
  TERN_ASSIGN_OR_RETURN(AdminTarget target, ParseAdminAddress(address));
  TERN_REQUIRE(ValidRequestPath(path), kInvalidArgument, "admin: bad path ", Printable(path));
  TERN_REQUIRE(options.timeout_ms > 0, kInvalidArgument, "admin: timeout_ms must be > 0");
  const std::string where = std::string(method) + " " + std::string(address) + std::string(path);
  const auto timeout = std::chrono::milliseconds(options.timeout_ms);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_ptr<HttpsClientTls> tls;
  std::optional<SigpipeBlock> quiet;  // OpenSSL writes with write(2)
  if (target.tls) {
    TERN_ASSIGN_OR_RETURN(tls, HttpsClientTls::Create(
                                   options.ca_pem, options.cert_pem, options.key_pem,
                                   {"admin TLS", "--admin-cacert", "--admin-cert", "--admin-key"}));
    quiet.emplace();
  } else {
    TERN_REQUIRE(options.ca_pem.empty(), kInvalidArgument, "admin ", where,
                 ": a CA (--admin-cacert) is given for a plain http address; say https://");
    TERN_REQUIRE(options.cert_pem.empty() && options.key_pem.empty(), kInvalidArgument, "admin ",
                 where,
                 ": a client certificate (--admin-cert, --admin-key) is given for a plain http "
                 "address; say https://");
  }
  try {
    std::unique_ptr<httplib::ClientImpl> client;
    if (tls) {
      TERN_ASSIGN_OR_RETURN(client, tls->Connect(target.host, target.port));
    } else {
      client = std::make_unique<httplib::ClientImpl>(target.host, target.port);
    }
    httplib::ClientImpl& cli = *client;
    cli.set_connection_timeout(timeout);
    cli.set_read_timeout(timeout);
    cli.set_write_timeout(timeout);
    cli.set_keep_alive(false);
    httplib::Request req;
    req.method = method;
    req.path = std::string(path);
    if (!options.token.empty()) req.set_header("Authorization", "Bearer " + options.token);
    if (std::string_view(method) == "POST") {
      req.body = std::string(body);
      req.set_header("Content-Type", options.content_type);
    }
    std::string reply;
    bool too_big = false, too_slow = false;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (reply.size() + n > options.max_reply_bytes) return !(too_big = true);
      if (std::chrono::steady_clock::now() > deadline) return !(too_slow = true);
      reply.append(data, n);
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    if (tls) ERR_clear_error();  // what is queued after send is this request's
    bool sent = false, stopped = false;
    {
      CallWatchdog watchdog(deadline);
      cli.set_socket_options([&watchdog](socket_t fd) { watchdog.Watch(fd); });
      sent = cli.send(req, res, err);
      stopped = watchdog.fired();
    }
    TERN_REQUIRE(!too_big, kResourceExhausted, "admin ", where, ": reply over ",
                 options.max_reply_bytes, " bytes");
    // Also when httplib took the shutdown for the end of a body without a
    // length: what came may be cut short.
    TERN_REQUIRE(!too_slow && !stopped, kTimeout, "admin ", where, ": no complete reply within ",
                 options.timeout_ms, " ms");
    if (!sent && tls) {
      bool refused = false;
      const std::string why = HttpsClientTls::HandshakeError(&refused);
      if (refused) {
        return TERN_ERROR(kAuth, "admin ", where, ": the server's certificate was refused: ", why,
                          " (is it signed by the CA given with --admin-cacert, and does it name ",
                          target.host, "?)");
      }
      // The server's alert about our certificate. Under TLS 1.3 the client
      // finishes its handshake before the server has checked it, so the
      // alert arrives at the first read.
      if (IsTlsCertificateAlert(why)) {
        // "handshake failure" is what a TLS 1.2 server sends for a missing
        // certificate, but also when it shares no cipher suite (or group,
        // or signature algorithm) with us: say both rather than guess.
        if (why.find("handshake failure") != std::string::npos) {
          return TERN_ERROR(kAuth, "admin ", where, ": the server refused the TLS handshake: ", why,
                            options.cert_pem.empty()
                                ? " (it may require a client certificate, and none was given "
                                  "(--admin-cert, --admin-key); or it shares no cipher suite "
                                  "with this client)"
                                : " (it may have refused our client certificate (is --admin-cert "
                                  "signed by the CA it trusts?); or it shares no cipher suite "
                                  "with this client)");
        }
        if (options.cert_pem.empty()) {
          return TERN_ERROR(kAuth, "admin ", where,
                            ": the server requires a client certificate and none was given "
                            "(--admin-cert, --admin-key): ",
                            why);
        }
        return TERN_ERROR(kAuth, "admin ", where,
                          ": the server refused our client certificate: ", why,
                          " (is --admin-cert signed by the CA the server trusts "
                          "(--admin-tls-client-ca), and made for clients?)");
      }
      if (err == httplib::Error::SSLConnection) {
        return TERN_ERROR(kUnavailable, "admin ", where, ": TLS handshake failed",
                          why.empty() ? "" : ": " + why,
                          " (does that port speak TLS? a plain http port fails this way)");
      }
    }
    if (!sent) {
      if (err == httplib::Error::Write && !body.empty()) {
        // The server answers a refusal from the head and closes; httplib's
        // client writes the whole body before it reads, so the answer is lost.
        return TERN_ERROR(kUnavailable, "admin ", where,
                          ": the server closed the connection before the whole body (", body.size(),
                          " bytes) was sent: it refuses a request from its head alone (a "
                          "missing or wrong token, no such route, a body over the route's limit; "
                          "its log says which)");
      }
      if (err == httplib::Error::ConnectionTimeout || err == httplib::Error::Read) {
        return TERN_ERROR(kTimeout, "admin ", where, ": ", httplib::to_string(err));
      }
      return TERN_ERROR(kUnavailable, "admin ", where, ": ", httplib::to_string(err));
    }
    if (res.status >= 200 && res.status < 300) return reply;
    std::string_view text(reply);
    text = text.substr(0, 300);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
    const std::string why = Printable(text);
    const std::string msg =
        "admin " + where + ": " + std::to_string(res.status) + (why.empty() ? "" : ": " + why);
    switch (res.status) {
      case 401:
      case 403:
        return Status(Code::kAuth, msg);
      case 404:
        return Status(Code::kNotFound, msg);
      case 408:
        return Status(Code::kTimeout, msg);
      case 413:
        return Status(Code::kResourceExhausted, msg);
      default:
        return Status(
            res.status >= 400 && res.status < 500 ? Code::kInvalidArgument : Code::kUnavailable,
            msg);
    }
  } catch (const std::exception& e) {
    return TERN_ERROR(kInternal, "admin ", where, ": ", e.what());
  }
}

}  // namespace

int AdminHttpStatusOf(const Status& s) {
  switch (s.code()) {
    case Code::kInvalidArgument:
    case Code::kOutOfRange:
    case Code::kMismatch:
    case Code::kAlreadyExists:
      return 409;
    case Code::kNotFound:
      return 404;
    case Code::kAuth:
      return 403;
    case Code::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

Result<AdminTarget> ParseAdminAddress(std::string_view address) {
  AdminTarget out;
  std::string_view rest = address;
  if (rest.substr(0, 8) == "https://") {
    out.tls = true;
    rest.remove_prefix(8);
  } else if (rest.substr(0, 7) == "http://") {
    rest.remove_prefix(7);
  }
  TERN_REQUIRE(rest.find('/') == std::string_view::npos, kInvalidArgument, "admin address ",
               Printable(address.substr(0, 200)), ": want [http:// or https://]HOST:PORT, no path");
  auto hp = ParseHostPort(rest);
  if (!hp.ok()) {
    return TERN_ERROR(kInvalidArgument, "admin address ", Printable(address.substr(0, 200)),
                      ": want [http:// or https://]HOST:PORT: ", hp.status().message());
  }
  TERN_REQUIRE(hp->port != 0, kInvalidArgument, "admin address ", Printable(address.substr(0, 200)),
               ": the port must be 1..65535");
  out.host = std::move(hp->host);
  out.port = hp->port;
  return out;
}

Result<std::string> AdminGet(std::string_view address, std::string_view path,
                             const AdminClientOptions& options) {
  return AdminCall("GET", address, path, {}, options);
}

Result<std::string> AdminPost(std::string_view address, std::string_view path,
                              std::string_view json_body, const AdminClientOptions& options) {
  return AdminCall("POST", address, path, json_body, options);
}

}  // namespace tern::agent
