#include "base/mutex.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace tern {
namespace {

uint64_t SteadyNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// The calling thread's CPU time (us) and context switches, voluntary and
// involuntary (zeros when getrusage fails, which it does not for RUSAGE_THREAD).
struct ThreadUsage {
  uint64_t cpu_us = 0, voluntary = 0, involuntary = 0;
};
ThreadUsage ReadThreadUsage() {
  rusage ru{};
  if (::getrusage(RUSAGE_THREAD, &ru) != 0) return {};
  auto us = [](const timeval& t) {
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000 + static_cast<uint64_t>(t.tv_usec);
  };
  return {us(ru.ru_utime) + us(ru.ru_stime), static_cast<uint64_t>(ru.ru_nvcsw),
          static_cast<uint64_t>(ru.ru_nivcsw)};
}

// "agent_root.cc:812 PublishViewLocked": the file's last component, the line,
// the function's name (__builtin_FUNCTION: unqualified, no arguments).
std::string SiteText(const LockSite& at) {
  const char* file = at.file;
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  std::string site = std::string(file) + ":" + std::to_string(at.line);
  if (at.function[0] != '\0') site += " " + std::string(at.function);
  return site;
}

}  // namespace

void LockWatch::Taken(const LockSite& at) {
  since_ns_ = SteadyNs();
  const ThreadUsage u = ReadThreadUsage();
  since_cpu_us_ = u.cpu_us;
  since_blocked_ = u.voluntary;
  since_preempted_ = u.involuntary;
  at_ = at;
}

void LockWatch::Released() {
  const uint64_t held_us = (SteadyNs() - since_ns_) / 1000;
  if (held_us < slow_us_) return;
  const ThreadUsage u = ReadThreadUsage();
  auto since = [](uint64_t now, uint64_t then) { return now > then ? now - then : 0; };
  Hold hold{SiteText(at_), held_us, std::min(since(u.cpu_us, since_cpu_us_), held_us),
            since(u.voluntary, since_blocked_), since(u.involuntary, since_preempted_), 0};
  std::lock_guard<std::mutex> lock(stats_mu_);
  hold.seq = ++stats_.slow_holds;
  if (held_us > stats_.longest.held_us) stats_.longest = hold;
  if (stats_.recent.size() == kSlowHolds) stats_.recent.erase(stats_.recent.begin());
  stats_.recent.push_back(std::move(hold));
}

LockWatch::Stats LockWatch::Read() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

std::vector<LockWatch::Hold> LockWatch::Since(uint64_t after) const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  std::vector<Hold> out;
  for (const Hold& h : stats_.recent)
    if (h.seq > after) out.push_back(h);
  return out;
}

}  // namespace tern
