// The test watchdog itself (tests/support/test_main.cc): run by ctest with
// TERN_TEST_WATCHDOG_S=2, this test must end in the watchdog's report with
// its own frame in the stacks (tests/CMakeLists.txt checks the output).
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

TEST(WatchdogSelfTest, DISABLED_HangsOnPurpose) {
  std::this_thread::sleep_for(std::chrono::seconds(60));
  FAIL() << "the watchdog did not fire within 60 s";
}
