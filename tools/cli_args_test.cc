// The command-line conventions: exact integers, and which failures map to
// which exit status (docs/cli.md).
#include "tools/cli_args.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace tern::cli {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

TEST(ParseUnsigned, TakesEveryU64Exactly) {
  EXPECT_EQ(ParseUnsigned("0").value(), 0u);
  EXPECT_EQ(ParseUnsigned("007").value(), 7u);  // decimal, not octal
  // 2^53 + 1: a double would store ...992.
  EXPECT_EQ(ParseUnsigned("9007199254740993").value(), 9007199254740993u);
  EXPECT_EQ(ParseUnsigned("18446744073709551615").value(), kMax);
  EXPECT_EQ(ParseUnsigned("4294967295", 4294967295u).value(), 4294967295u);
}

TEST(ParseUnsigned, RefusesEverythingButPlainDecimal) {
  for (const char* text : {"", " ", "0x10", "1e3", "-1", "+1", " 1", "1 ", "1.0", "1.", "abc",
                           "10M", "1_000", "١"}) {
    Result<uint64_t> r = ParseUnsigned(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << text;
    EXPECT_NE(r.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << r.status().message();
  }
}

TEST(ParseUnsigned, RefusesOverflowAndValuesAboveTheMaximum) {
  for (const char* text : {"18446744073709551616", "18446744073709551620", "99999999999999999999",
                           "340282366920938463463374607431768211457"}) {
    Result<uint64_t> r = ParseUnsigned(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), Code::kOutOfRange) << text;
    EXPECT_NE(r.status().message().find("larger than 18446744073709551615"), std::string::npos);
  }
  EXPECT_EQ(ParseUnsigned("4294967296", 4294967295u).status().code(), Code::kOutOfRange);
  EXPECT_EQ(ParseUnsigned("101", 100).status().code(), Code::kOutOfRange);
  EXPECT_EQ(ParseUnsigned("100", 100).value(), 100u);
}

TEST(SplitCommas, ItemsInOrderEmptyOnesDropped) {
  using V = std::vector<std::string>;
  EXPECT_EQ(SplitCommas("a,b,c"), (V{"a", "b", "c"}));
  EXPECT_EQ(SplitCommas("a,,b,"), (V{"a", "b"}));
  EXPECT_EQ(SplitCommas(",lm_head"), (V{"lm_head"}));
  EXPECT_EQ(SplitCommas(" a , b"), (V{" a ", " b"}));  // no trimming: names are exact
  EXPECT_EQ(SplitCommas(""), V{});
  EXPECT_EQ(SplitCommas(",,,"), V{});
}

TEST(ParseCount, SuffixesAreExactPowersOfAThousand) {
  EXPECT_EQ(ParseCount("1048576").value(), 1048576u);
  EXPECT_EQ(ParseCount("300K").value(), 300'000u);
  EXPECT_EQ(ParseCount("300k").value(), 300'000u);
  EXPECT_EQ(ParseCount("10M").value(), 10'000'000u);
  EXPECT_EQ(ParseCount("1.5G").value(), 1'500'000'000u);
  EXPECT_EQ(ParseCount("20T").value(), 20'000'000'000'000u);
  EXPECT_EQ(ParseCount("1.000000000001T").value(), 1'000'000'000'001u);
  EXPECT_EQ(ParseCount("2.50M").value(), 2'500'000u);
  EXPECT_EQ(ParseCount("0M").value(), 0u);
  EXPECT_EQ(ParseCount("0.5K").value(), 500u);
  EXPECT_EQ(ParseCount("18446744073709551615").value(), kMax);
  EXPECT_EQ(ParseCount("18446744073709551K").value(), 18446744073709551000u);
  EXPECT_EQ(ParseCount("18446744073709.551615M").value(), kMax);
  // Beyond a double's 53 bits, still exact.
  EXPECT_EQ(ParseCount("9007199254.740993M").value(), 9007199254740993u);
}

TEST(ParseCount, RefusesFractionsGarbageAndOverflow) {
  for (const char* text : {"", "K", "1.5", "0.0005K", "1.2345K", "1e3", "1e3K", "0x10", "0x10K",
                           "-1", "-1K", "+1K", ".5M", "5.M", "1.5.5M", "10MB", "10 M", "1KK",
                           "1m", "1P"}) {
    Result<uint64_t> r = ParseCount(text);
    EXPECT_FALSE(r.ok()) << text;
  }
  for (const char* text : {"18446744073709551616", "18446744073709552K", "18446744073709551.616K",
                           "20000000T", "99999999999999999999999T"}) {
    Result<uint64_t> r = ParseCount(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), Code::kOutOfRange) << text;
  }
  EXPECT_EQ(ParseCount("1.1K", 1000).status().code(), Code::kOutOfRange);
  EXPECT_EQ(ParseCount("1K", 1000).value(), 1000u);
}

// A command line parsed by CLI11 with tern's options; returns the parse
// error's message, or "" when it parsed.
std::string ParseWith(CLI::App& app, std::vector<std::string> args) {
  std::vector<char*> argv;
  std::string name = "test";
  argv.push_back(name.data());
  for (std::string& a : args) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(Options, UnsignedFlagsParseExactlyAndRefuseWithTheFlagsName) {
  for (const char* text : {"9007199254740993", "18446744073709551615", "0"}) {
    CLI::App app;
    uint64_t v = 1;
    AddUnsigned(app, "--base-version", v, "", "5");
    EXPECT_EQ(ParseWith(app, {"--base-version", text}), "");
    EXPECT_EQ(v, ParseUnsigned(text).value()) << text;
  }
  // Plain CLI11 2.1.2 would take each of these (strtoull with base 0).
  for (const char* text : {"0x10", "010x", "-1", "1e3", "18446744073709551616", " 7"}) {
    CLI::App app;
    uint64_t v = 1;
    AddUnsigned(app, "--base-version", v, "", "5");
    const std::string error = ParseWith(app, {"--base-version=" + std::string(text)});
    EXPECT_NE(error.find("--base-version"), std::string::npos) << text << ": " << error;
    EXPECT_NE(error.find(std::string("'") + text + "'"), std::string::npos) << error;
  }
  // "010" is ten, not octal eight.
  CLI::App app;
  uint64_t v = 0;
  AddUnsigned(app, "--n", v, "", "0");
  EXPECT_EQ(ParseWith(app, {"--n", "010"}), "");
  EXPECT_EQ(v, 10u);
}

TEST(Options, NarrowTypesAndMaximaAreBounds) {
  CLI::App app;
  uint32_t streams = 0;
  unsigned threads = 0;
  AddUnsigned(app, "--streams", streams, "", "0");
  AddUnsigned(app, "--threads", threads, "", "0", 1024);
  EXPECT_NE(ParseWith(app, {"--streams", "4294967296"}).find("larger than 4294967295"),
            std::string::npos);
  CLI::App app2;
  AddUnsigned(app2, "--threads", threads, "", "0", 1024);
  EXPECT_NE(ParseWith(app2, {"--threads", "1025"}).find("larger than 1024"), std::string::npos);
}

TEST(Options, DefaultsAreTextParsedLikeValuesAndShownAsWritten) {
  CLI::App app("", "cmd");
  Configure(app);
  uint64_t chunk = 0, params = 0;
  double lr = 0;
  AddCount(app, "--chunk", chunk, "chunk size", "4M");
  AddCount(app, "--params", params, "", "10M");
  AddDouble(app, "--lr", lr, "", "1e-6");
  EXPECT_EQ(chunk, 4'000'000u);
  EXPECT_EQ(lr, 1e-6);
  EXPECT_EQ(ParseWith(app, {"--params", "1.5G"}), "");
  EXPECT_EQ(params, 1'500'000'000u);
  EXPECT_EQ(chunk, 4'000'000u);
  const std::string help = app.help();
  EXPECT_NE(help.find("usage: cmd"), std::string::npos) << help;
  EXPECT_NE(help.find("4M"), std::string::npos) << help;
}

TEST(Options, FloatsStayFloatsButMustBeFiniteDecimals) {
  for (const char* text : {"1e-6", "0.9", "-1", "3", "1E+3"}) {
    CLI::App app;
    double v = 0;
    AddDouble(app, "--lr", v, "", "1");
    EXPECT_EQ(ParseWith(app, {"--lr", text}), "") << text;
    EXPECT_EQ(v, std::strtod(text, nullptr));
  }
  for (const char* text : {"nan", "inf", "0x1p3", "1e999", "", "1,5", "abc"}) {
    CLI::App app;
    double v = 0;
    AddDouble(app, "--lr", v, "", "1");
    EXPECT_NE(ParseWith(app, {"--lr=" + std::string(text)}).find("--lr"), std::string::npos) << text;
  }
}

// Runs dispatch on argv and returns {exit status, stderr}.
std::pair<int, std::string> RunDispatch(const Dispatch& dispatch, CLI::App& app,
                                        std::vector<std::string> args) {
  std::vector<char*> argv;
  std::string name = "tern";
  argv.push_back(name.data());
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  const int code = dispatch.Run(app, static_cast<int>(argv.size()), argv.data());
  testing::internal::GetCapturedStdout();
  return {code, testing::internal::GetCapturedStderr()};
}

struct Fixture {
  CLI::App app{"test", "tern"};
  Dispatch dispatch;
  uint64_t n = 0;
  std::string path;
  bool checked = false, worked = false;
  Status check_result, work_result;
  CLI::App* cmd = nullptr;

  Fixture() {
    Configure(app);
    app.require_subcommand(1);
    cmd = app.add_subcommand("thing", "a command");
    AddUnsigned(*cmd, "--n", n, "", "1");
    cmd->add_option("PATH", path, "")->required();
    dispatch.On(cmd, {[this] {
                        checked = true;
                        return check_result;
                      },
                      [this] {
                        worked = true;
                        return work_result;
                      }});
  }
};

void ExpectOneLine(const std::string& err, const std::string& prefix, const std::string& needle) {
  ASSERT_FALSE(err.empty());
  EXPECT_EQ(err.find('\n'), err.size() - 1) << err;
  EXPECT_EQ(err.rfind(prefix, 0), 0u) << err;
  EXPECT_NE(err.find(needle), std::string::npos) << err;
}

TEST(Dispatch, UsageErrorsExit2BeforeAnyWork) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"thing", "p", "--n", "0x10"}, "'0x10'"},
      {{"thing", "p", "--bogus"}, "--bogus"},
      {{"thing"}, "PATH"},
      {{"thing", "p", "q"}, "q"},
      {{"nonsense"}, "unknown command 'nonsense'"},
      {{}, "a command is required"},
  };
  for (const auto& [args, needle] : cases) {
    Fixture f;
    auto [code, err] = RunDispatch(f.dispatch, f.app, args);
    EXPECT_EQ(code, kExitUsage) << err;
    ExpectOneLine(err, "tern", needle);
    EXPECT_FALSE(f.checked || f.worked);
  }
}

TEST(Dispatch, ACheckFailureIsAUsageErrorAndAWorkFailureIsAFailure) {
  {
    Fixture f;
    f.check_result = Status(Code::kInvalidArgument, "--n contradicts PATH");
    auto [code, err] = RunDispatch(f.dispatch, f.app, {"thing", "p"});
    EXPECT_EQ(code, kExitUsage);
    ExpectOneLine(err, "tern thing: ", "--n contradicts PATH");
    EXPECT_FALSE(f.worked);
  }
  for (Code c : {Code::kInvalidArgument, Code::kNotFound, Code::kCorrupt, Code::kAlreadyExists}) {
    // The code does not decide: any error of the work step is a failure.
    Fixture f;
    f.work_result = Status(c, "it broke");
    auto [code, err] = RunDispatch(f.dispatch, f.app, {"thing", "p", "--n", "7"});
    EXPECT_EQ(code, kExitFailed);
    ExpectOneLine(err, "tern thing: ", "it broke");
    EXPECT_EQ(f.n, 7u);
  }
  {
    Fixture f;
    auto [code, err] = RunDispatch(f.dispatch, f.app, {"thing", "p"});
    EXPECT_EQ(code, kExitOk);
    EXPECT_EQ(err, "");
    EXPECT_TRUE(f.checked && f.worked);
    EXPECT_EQ(f.path, "p");
  }
}

TEST(Dispatch, HelpExits0AndShowsTheCommandsUsage) {
  Fixture f;
  std::vector<std::string> args = {"thing", "--help"};
  std::vector<char*> argv;
  std::string name = "tern";
  argv.push_back(name.data());
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  const int code = f.dispatch.Run(f.app, static_cast<int>(argv.size()), argv.data());
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, kExitOk);
  EXPECT_NE(out.find("usage: tern thing"), std::string::npos) << out;
  EXPECT_NE(out.find("--n"), std::string::npos) << out;
  EXPECT_FALSE(f.worked);
}

}  // namespace
}  // namespace tern::cli
