// ServeHook (agent/daemon/serve_hook.h).
#include "agent/daemon/serve_hook.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "agent/daemon/event_json.h"

extern char** environ;

namespace tern::agent {
namespace {

constexpr int kPollMs = 10;

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

ServeHook::ServeHook(EventRing& ring, std::string command, uint32_t timeout_ms, LogFn log)
    : ring_(ring), command_(std::move(command)), timeout_ms_(timeout_ms), log_(std::move(log)) {}

ServeHook::~ServeHook() { Stop(); }

void ServeHook::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ServeHook::Stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void ServeHook::Loop() {
  uint64_t after = 0;
  std::vector<AgentEvent> events;
  while (!stopping_) {
    // Short waits: Stop is seen within one.
    Status st = ring_.Wait(after, kMaxEventsPerWait, 1000, &events);
    if (!st.ok()) return;  // the agent is stopping
    const AgentEvent* newest = nullptr;
    uint64_t served = 0;
    for (const AgentEvent& e : events) {
      after = e.seq;
      if (e.kind != AgentEvent::Kind::kVersionServed) continue;
      ++served;
      newest = &e;
    }
    if (served > 1) counts_.coalesced += served - 1;
    if (newest) Run(*newest);
  }
}

void ServeHook::Run(const AgentEvent& e) {
  const std::string input = EventJsonText(e) + "\n";
  // Everything the child needs is built before fork (after it, in a
  // threaded process, only async-signal-safe calls).
  std::vector<std::string> env_strings;
  for (char** p = environ; *p != nullptr; ++p)
    if (std::string_view(*p).rfind("TERN_EVENT_", 0) != 0) env_strings.emplace_back(*p);
  env_strings.push_back("TERN_EVENT_SEQ=" + std::to_string(e.seq));
  env_strings.push_back("TERN_EVENT_VERSION=" + std::to_string(e.version));
  env_strings.push_back("TERN_EVENT_EPOCH=" + std::to_string(e.epoch));
  env_strings.push_back("TERN_EVENT_DIGEST=" + e.digest.ToString());
  env_strings.push_back("TERN_EVENT_SLOT_DIR=" + e.slot_dir);
  env_strings.push_back(std::string("TERN_EVENT_ALL_TENSORS=") + (e.all_tensors ? "1" : "0"));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const char* argv[] = {"sh", "-c", command_.c_str(), nullptr};
  // A socket, not a pipe, for stdin: send(MSG_NOSIGNAL) to a child that
  // left without reading is an error here, never a SIGPIPE for the agent.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    ++counts_.failed;
    log_("serve hook: socketpair: " + std::string(std::strerror(errno)));
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(sv[1], 0);  // dup2 clears close-on-exec on fd 0
    ::execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
    ::_exit(127);
  }
  ::close(sv[1]);
  if (pid < 0) {
    ::close(sv[0]);
    ++counts_.failed;
    log_("serve hook: fork: " + std::string(std::strerror(errno)));
    return;
  }
  ::setpgid(pid, pid);  // also here: whichever runs first
  ::fcntl(sv[0], F_SETFL, O_NONBLOCK);
  size_t sent = 0;
  int status = 0;
  bool ended = false, killed = false;
  const double timeout_s = timeout_ms_ / 1000.0;
  while (!ended) {
    if (sv[0] >= 0 && sent < input.size()) {
      const ssize_t n = ::send(sv[0], input.data() + sent, input.size() - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) sent = input.size();  // it stopped reading
    }
    if (sv[0] >= 0 && sent == input.size()) {
      ::close(sv[0]);  // end of stdin
      sv[0] = -1;
    }
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      ended = true;
      break;
    }
    if (stopping_ || SecondsSince(t0) >= timeout_s) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      killed = true;
      break;
    }
    ::poll(nullptr, 0, kPollMs);
  }
  if (sv[0] >= 0) ::close(sv[0]);
  const std::string what = "serve hook for version " + std::to_string(e.version) + " (event " +
                           std::to_string(e.seq) + ")";
  const std::string took = std::to_string(SecondsSince(t0)) + " s";
  if (killed) {
    ++counts_.killed;
    // Its group too: a child it left behind would otherwise outlive it.
    ::kill(-pid, SIGKILL);
    log_(what + " killed after " + took + (stopping_ ? " (the agent stops)" : " (its deadline)"));
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    ++counts_.ok;
    log_(what + " exited 0 in " + took);
  } else {
    ++counts_.failed;
    log_(what +
         (WIFEXITED(status) ? " exited " + std::to_string(WEXITSTATUS(status))
                            : " ended by signal " + std::to_string(WTERMSIG(status))) +
         " in " + took);
  }
}

}  // namespace tern::agent
