#include "agent/testing/etcd_test_server.h"

#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace tern::agent {
namespace {

using SteadyTime = std::chrono::steady_clock;

std::string FindEtcd() {
  if (const char* env = std::getenv("TERN_ETCD"); env != nullptr && *env != '\0') {
    return access(env, X_OK) == 0 ? env : "";
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/etcd";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Two distinct free loopback ports (held open together so they differ). A
// race with another process between this and etcd's bind is possible;
// Start retries with fresh ports.
Status FreePorts(int* a, int* b) {
  int fds[2] = {-1, -1};
  int ports[2] = {0, 0};
  Status status;
  for (int i = 0; i < 2 && status.ok(); ++i) {
    fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fds[i] < 0 || bind(fds[i], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fds[i], reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = TERN_ERRNO("etcd test server: picking a free port");
    } else {
      ports[i] = ntohs(addr.sin_port);
    }
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  *a = ports[0];
  *b = ports[1];
  return status;
}

// Test names and passwords go into JSON unescaped: keep them plain.
bool Plain(const std::string& s) {
  for (char c : s) {
    if (c <= ' ' || c > '~' || c == '"' || c == '\\') return false;
  }
  return true;
}

std::string Base64(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(n < 0 ? 0 : n);
  return out;
}

bool Openssl(const std::string& args) {
  return std::system(("openssl " + args + " >/dev/null 2>&1").c_str()) == 0;
}

// A P-256 CA, self-signed, for two days.
bool MakeCa(const std::string& stem, const std::string& subject) {
  return Openssl("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
                 stem + ".key -out " + stem + ".pem -days 2 -subj " + subject);
}

// A P-256 certificate for `subject` with `sans` (may be empty), signed by ca.
bool MakeLeaf(const std::string& stem, const std::string& subject, const std::string& sans,
              const std::string& ca) {
  {
    std::ofstream ext(stem + ".ext");
    if (!sans.empty()) ext << "subjectAltName=" << sans << "\n";
    if (!ext) return false;
  }
  return Openssl("req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + stem +
                 ".key -out " + stem + ".csr -subj " + subject) &&
         Openssl("x509 -req -in " + stem + ".csr -CA " + ca + ".pem -CAkey " + ca +
                 ".key -CAcreateserial -out " + stem + ".pem -days 2 -extfile " + stem + ".ext");
}

std::string LogTail(const std::string& path) {
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.size() > 600 ? all.substr(all.size() - 600) : all;
}

}  // namespace

EtcdTestServer::EtcdTestServer(EtcdTestServerOptions options, std::string binary, std::string dir)
    : options_(options), binary_(std::move(binary)), dir_(std::move(dir)) {}

EtcdTestServer::~EtcdTestServer() {
  if (pid_ > 0) Kill().IgnoreError();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

Result<std::unique_ptr<EtcdTestServer>> EtcdTestServer::Start(EtcdTestServerOptions options) {
  std::string binary = FindEtcd();
  TERN_REQUIRE(!binary.empty(), kUnsupported,
               "no etcd binary (set TERN_ETCD or install Debian's etcd-server)");
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/tern-etcd-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return TERN_ERRNO("mkdtemp ", pattern);
  TERN_REQUIRE(options.tls || !options.client_cert_auth, kInvalidArgument,
               "etcd test server: client_cert_auth needs tls");
  std::unique_ptr<EtcdTestServer> server(
      new EtcdTestServer(options, std::move(binary), std::string(buf.data())));
  if (options.tls) TERN_RETURN_IF_ERROR(server->MakePki());
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    TERN_RETURN_IF_ERROR(FreePorts(&server->client_port_, &server->peer_port_));
    last = server->Launch();
    if (last.ok()) last = server->WaitHealthy();
    if (last.ok()) return server;
    if (server->pid_ > 0) server->Kill().IgnoreError();
    std::error_code ec;
    std::filesystem::remove_all(server->dir_ + "/data", ec);
  }
  return last;
}

std::string EtcdTestServer::host_port() const {
  return "127.0.0.1:" + std::to_string(client_port_);
}

std::string EtcdTestServer::endpoint() const {
  return (options_.tls ? "https://" : "") + host_port();
}

Status EtcdTestServer::MakePki() {
  const std::string d = dir_ + "/pki";
  std::error_code ec;
  std::filesystem::create_directories(d, ec);
  TERN_REQUIRE(!ec, kIo, "etcd test server: mkdir ", d, ": ", ec.message());
  const bool ok = MakeCa(d + "/ca", "/CN=tern-etcd-test-ca") &&
                  MakeCa(d + "/other-ca", "/CN=tern-etcd-other-ca") &&
                  MakeLeaf(d + "/server", "/CN=etcd", "IP:127.0.0.1,DNS:localhost", d + "/ca") &&
                  MakeLeaf(d + "/client", "/O=tern", "DNS:client.tern.test", d + "/ca") &&
                  MakeLeaf(d + "/cn-client", "/CN=tern-client", "", d + "/ca") &&
                  MakeLeaf(d + "/other-client", "/O=tern", "", d + "/other-ca");
  TERN_REQUIRE(ok, kInternal, "etcd test server: the openssl CLI failed to make certificates in ",
               d, " (is openssl installed? scripts/install-deps.sh)");
  pki_.ca_cert = d + "/ca.pem";
  pki_.client_cert = d + "/client.pem";
  pki_.client_key = d + "/client.key";
  pki_.cn_client_cert = d + "/cn-client.pem";
  pki_.cn_client_key = d + "/cn-client.key";
  pki_.other_ca_cert = d + "/other-ca.pem";
  pki_.other_client_cert = d + "/other-client.pem";
  pki_.other_client_key = d + "/other-client.key";
  return Status::Ok();
}

std::unique_ptr<httplib::ClientImpl> EtcdTestServer::Http() const {
  std::unique_ptr<httplib::ClientImpl> http;
  if (options_.tls) {
    auto ssl = std::make_unique<httplib::SSLClient>("127.0.0.1", client_port_, pki_.client_cert,
                                                    pki_.client_key);
    ssl->set_ca_cert_path(pki_.ca_cert);
    ssl->enable_server_certificate_verification(true);
    http = std::move(ssl);
  } else {
    http = std::make_unique<httplib::ClientImpl>("127.0.0.1", client_port_);
  }
  http->set_connection_timeout(0, 500'000);
  http->set_read_timeout(5, 0);
  http->set_write_timeout(5, 0);
  return http;
}

Status EtcdTestServer::Api(const std::string& path, const std::string& body) {
  auto http = Http();
  httplib::Headers headers;
  if (!root_password_.empty()) {
    auto auth = http->Post("/v3/auth/authenticate",
                           R"({"name":"root","password":")" + root_password_ + R"("})",
                           "application/json");
    TERN_REQUIRE(auth && auth->status == 200, kInternal,
                 "etcd test server: authenticating as root failed");
    const std::string marker = R"("token":")";
    const size_t at = auth->body.find(marker);
    const size_t end = at == std::string::npos ? at : auth->body.find('"', at + marker.size());
    TERN_REQUIRE(end != std::string::npos, kInternal, "etcd test server: no root token");
    headers.emplace("Authorization", auth->body.substr(at + marker.size(), end - at - marker.size()));
  }
  auto res = http->Post(path, headers, body, "application/json");
  TERN_REQUIRE(res, kUnavailable, "etcd test server: ", path, ": ", httplib::to_string(res.error()));
  TERN_REQUIRE(res->status == 200 && res->body.find("\"error\"") == std::string::npos, kInternal,
               "etcd test server: ", path, ": HTTP ", res->status, ": ", res->body.substr(0, 300));
  return Status::Ok();
}

Status EtcdTestServer::AddUser(const std::string& name, const std::string& password,
                               const std::string& prefix) {
  TERN_REQUIRE(Plain(name) && Plain(password) && !name.empty() && !password.empty(),
               kInvalidArgument, "etcd test server: user and password must be plain ASCII");
  TERN_RETURN_IF_ERROR(Api("/v3/auth/role/add", R"({"name":")" + name + R"("})"));
  if (!prefix.empty()) {
    std::string end = prefix;  // prefix's range end (the prefix has no 0xff bytes in tests)
    end.back() = static_cast<char>(end.back() + 1);
    TERN_RETURN_IF_ERROR(Api("/v3/auth/role/grant",
                             R"({"name":")" + name + R"(","perm":{"key":")" + Base64(prefix) +
                                 R"(","range_end":")" + Base64(end) +
                                 R"(","permType":"READWRITE"}})"));
  }
  TERN_RETURN_IF_ERROR(Api("/v3/auth/user/add",
                           R"({"name":")" + name + R"(","password":")" + password + R"("})"));
  return Api("/v3/auth/user/grant", R"({"user":")" + name + R"(","role":")" + name + R"("})");
}

Status EtcdTestServer::ChangePassword(const std::string& name, const std::string& password) {
  TERN_REQUIRE(Plain(name) && Plain(password) && !name.empty() && !password.empty(),
               kInvalidArgument, "etcd test server: user and password must be plain ASCII");
  return Api("/v3/auth/user/changepw",
             R"({"name":")" + name + R"(","password":")" + password + R"("})");
}

Status EtcdTestServer::EnableAuth(const std::string& root_password) {
  TERN_REQUIRE(Plain(root_password) && !root_password.empty(), kInvalidArgument,
               "etcd test server: the root password must be plain ASCII");
  TERN_REQUIRE(root_password_.empty(), kInvalidArgument, "etcd test server: auth already enabled");
  TERN_RETURN_IF_ERROR(
      Api("/v3/auth/user/add", R"({"name":"root","password":")" + root_password + R"("})"));
  TERN_RETURN_IF_ERROR(Api("/v3/auth/user/grant", R"({"user":"root","role":"root"})"));
  TERN_RETURN_IF_ERROR(Api("/v3/auth/enable", "{}"));
  root_password_ = root_password;
  return Status::Ok();
}

Status EtcdTestServer::Launch() {
  TERN_REQUIRE(pid_ <= 0, kInvalidArgument, "etcd test server: already running");
  const std::string client =
      (options_.tls ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(client_port_);
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> args = {
      binary_,
      "--name=tern-test",
      "--data-dir=" + dir_ + "/data",
      "--listen-client-urls=" + client,
      "--advertise-client-urls=" + client,
      "--listen-peer-urls=" + peer,
      "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=tern-test=" + peer,
      "--initial-cluster-state=new",
      "--heartbeat-interval=" + std::to_string(options_.heartbeat_ms),
      "--election-timeout=" + std::to_string(options_.election_ms),
      "--logger=zap",
      "--log-level=warn",
  };
  if (options_.tls) {
    args.push_back("--cert-file=" + dir_ + "/pki/server.pem");
    args.push_back("--key-file=" + dir_ + "/pki/server.key");
    args.push_back("--trusted-ca-file=" + pki_.ca_cert);
  }
  if (options_.client_cert_auth) args.push_back("--client-cert-auth");
  if (options_.auth_token_ttl_s != 0) {
    args.push_back("--auth-token-ttl=" + std::to_string(options_.auth_token_ttl_s));
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string log = dir_ + "/etcd.log";
  const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return TERN_ERRNO("open ", log);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return TERN_ERRNO("fork");
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec. etcd dies with the
    // test process, even when the test is killed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  pid_ = pid;
  return Status::Ok();
}

Status EtcdTestServer::WaitHealthy() {
  const auto deadline = SteadyTime::now() + std::chrono::milliseconds(options_.start_timeout_ms);
  auto http = Http();
  http->set_connection_timeout(0, 200'000);
  http->set_read_timeout(0, 500'000);
  while (SteadyTime::now() < deadline) {
    int wstatus = 0;
    if (waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return TERN_ERROR(kUnavailable, "etcd exited during start (status ", wstatus,
                        "): ", LogTail(dir_ + "/etcd.log"));
    }
    // /health is true only once the member has a raft leader.
    auto res = http->Get("/health");
    if (res && res->status == 200 && res->body.find("\"true\"") != std::string::npos) {
      return Status::Ok();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return TERN_ERROR(kTimeout, "etcd not healthy after ", options_.start_timeout_ms,
                    " ms: ", LogTail(dir_ + "/etcd.log"));
}

Status EtcdTestServer::Signal(int sig) {
  TERN_REQUIRE(pid_ > 0, kInvalidArgument, "etcd test server: not running");
  if (kill(pid_, sig) != 0 && errno != ESRCH) return TERN_ERRNO("kill etcd");
  const auto deadline = SteadyTime::now() + std::chrono::seconds(10);
  while (true) {
    int wstatus = 0;
    const pid_t r = waitpid(pid_, &wstatus, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) break;
    if (SteadyTime::now() >= deadline) {
      if (sig == SIGKILL) return TERN_ERROR(kTimeout, "etcd did not exit after SIGKILL");
      kill(pid_, SIGKILL);
      sig = SIGKILL;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
  return Status::Ok();
}

Status EtcdTestServer::Kill() { return Signal(SIGKILL); }
Status EtcdTestServer::Stop() { return Signal(SIGTERM); }

Status EtcdTestServer::Restart() {
  TERN_RETURN_IF_ERROR(Launch());
  Status s = WaitHealthy();
  if (!s.ok() && pid_ > 0) Kill().IgnoreError();
  return s;
}

}  // namespace tern::agent
