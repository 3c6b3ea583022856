// main() of every tern gtest binary: gtest's own, plus a watchdog. A test
// that runs longer than TERN_TEST_WATCHDOG_S seconds (default 300; 0 turns
// the watchdog off) prints every thread's stack, through gdb where it is
// installed, and exits with status 124. A hang in CI then says where it
// hung, rather than being killed silently by ctest's timeout.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace {

using Clock = std::chrono::steady_clock;

class Watchdog final : public ::testing::EmptyTestEventListener {
 public:
  explicit Watchdog(std::chrono::seconds limit) : limit_(limit), thread_([this] { Run(); }) {}
  ~Watchdog() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void OnTestStart(const ::testing::TestInfo& info) override {
    std::lock_guard<std::mutex> lock(mu_);
    test_ = std::string(info.test_suite_name()) + "." + info.name();
    deadline_ = Clock::now() + limit_;
    armed_ = true;
    cv_.notify_all();
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (stop_) return;
      if (!armed_) {
        cv_.wait(lock);
        continue;
      }
      if (Clock::now() < deadline_) {
        cv_.wait_until(lock, deadline_);
        continue;
      }
      std::fprintf(stderr, "\ntern test watchdog: %s still running after %lld s; stacks follow, then exit 124\n",
                   test_.c_str(), static_cast<long long>(limit_.count()));
      std::fflush(stdout);
      std::fflush(stderr);
      DumpStacks();
      std::_Exit(124);  // as timeout(1) does; no destructors: other threads still run
    }
  }

  // Runs `gdb -p <this process>` in a child, its output on our stderr.
  static void DumpStacks() {
#ifdef PR_SET_PTRACER
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // Yama: let the child attach
#endif
    const std::string pid = std::to_string(::getpid());
    const pid_t child = ::fork();
    if (child == 0) {
      ::dup2(2, 1);
      ::execlp("gdb", "gdb", "-p", pid.c_str(), "-batch", "-nx", "-ex", "thread apply all bt", nullptr);
      static const char kNoGdb[] = "tern test watchdog: gdb not found, no stacks (install gdb)\n";
      (void)!::write(2, kNoGdb, sizeof(kNoGdb) - 1);  // only async-signal-safe calls after fork
      ::_exit(127);
    }
    if (child > 0) {
      int status = 0;
      ::waitpid(child, &status, 0);
    }
  }

  const std::chrono::seconds limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool armed_ = false;
  std::string test_;
  Clock::time_point deadline_{};
  std::thread thread_;  // last: starts once the rest is constructed
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  long limit_s = 300;
  if (const char* env = std::getenv("TERN_TEST_WATCHDOG_S")) limit_s = std::strtol(env, nullptr, 10);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (limit_s > 0) listeners.Append(new Watchdog(std::chrono::seconds(limit_s)));  // gtest deletes it
  return RUN_ALL_TESTS();
}
