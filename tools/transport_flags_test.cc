// The transport flags (transport_flags.h) as TcpOptions: defaults, values
// with suffixes, and what is refused.
#include "tools/transport_flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tern::cli {
namespace {

// The options `args` (after the program name) ask for.
Result<TcpOptions> OptionsOf(std::vector<std::string> args) {
  CLI::App app("transport_flags_test");
  TransportArgs t;
  AddTransportFlags(app, t);
  args.insert(args.begin(), "--no-tls");
  std::vector<const char*> argv = {"transport_flags_test"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return Status(Code::kInvalidArgument, e.what());
  }
  return TransportOptions(t);
}

TEST(TransportFlags, MinFrameRateReachesTheTcpOptions) {
  auto o = OptionsOf({});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->min_frame_bytes_per_s, TcpOptions{}.min_frame_bytes_per_s);  // 64 KiB/s
  EXPECT_EQ(o->min_frame_bytes_per_s, 64u * 1024);
  o = OptionsOf({"--min-frame-rate", "1M"});  // suffixes are decimal (docs/cli.md)
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->min_frame_bytes_per_s, 1000000u);
  o = OptionsOf({"--min-frame-rate=0"});  // no minimum
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->min_frame_bytes_per_s, 0u);
  for (const char* bad : {"1.5", "-1", "64KB", "1e6", "18446744073709551616"}) {
    o = OptionsOf({"--min-frame-rate", bad});
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("--min-frame-rate"), std::string::npos)
        << o.status().message();
  }
}

TEST(TransportFlags, TheOtherTimeoutsStillReachTheOptions) {
  auto o = OptionsOf({"--idle-timeout-ms", "5000", "--min-wire-version", "2"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->idle_timeout_ms, 5000u);
  EXPECT_EQ(o->min_wire_version, 2u);
  EXPECT_FALSE(o->tls.enabled);
}

}  // namespace
}  // namespace tern::cli
