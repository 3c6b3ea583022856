// Sandbox: how client names become paths, and which are refused.
#include "xfer/server/sandbox.h"
#include "xfer/xfer_wire.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace tern::xfer {
namespace {

namespace fs = std::filesystem;

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tern-sandbox-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "root" / "sub");
    std::ofstream(dir_ / "root" / "sub" / "f.bin") << "inside";
    std::ofstream(dir_ / "secret") << "outside";
    fs::create_symlink(dir_ / "secret", dir_ / "root" / "out-link");
    fs::create_symlink(dir_ / "root" / "sub" / "f.bin", dir_ / "root" / "in-link");
    real_ = fs::canonical(dir_).string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string real_;  // dir_ with symlinks resolved (temp dirs may sit behind one)
};

TEST_F(SandboxTest, ResolvesNamesInsideTheRoot) {
  auto box = Sandbox::Open((dir_ / "root").string());
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  EXPECT_EQ(box->root(), real_ + "/root");
  auto p = box->Resolve("sub/f.bin");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, real_ + "/root/sub/f.bin");
  // A symlink that stays inside resolves to its target; "./" is harmless.
  EXPECT_EQ(box->Resolve("in-link").value(), real_ + "/root/sub/f.bin");
  EXPECT_EQ(box->Resolve("./sub//f.bin").value(), real_ + "/root/sub/f.bin");
}

TEST_F(SandboxTest, RefusesEscapesAndBadNames) {
  auto box = Sandbox::Open((dir_ / "root").string());
  ASSERT_TRUE(box.ok());
  struct Case {
    std::string name;
    Code code;
  };
  for (const Case& c : {Case{"../secret", Code::kInvalidArgument}, Case{"sub/../../secret", Code::kInvalidArgument},
                        Case{"sub/..", Code::kInvalidArgument}, Case{"/etc/passwd", Code::kInvalidArgument},
                        Case{"out-link", Code::kInvalidArgument}, Case{".", Code::kInvalidArgument},
                        Case{"", Code::kInvalidArgument}, Case{std::string("a\0b", 3), Code::kInvalidArgument},
                        Case{std::string(kMaxNameBytes + 1, 'a'), Code::kInvalidArgument},
                        Case{"nope", Code::kNotFound}}) {
    auto p = box->Resolve(c.name);
    ASSERT_FALSE(p.ok()) << c.name << " -> " << *p;
    EXPECT_EQ(p.status().code(), c.code) << c.name << ": " << p.status().ToString();
  }
  EXPECT_NE(box->Resolve("out-link").status().message().find("escapes the served root"), std::string::npos);
  // ".." inside a longer component is a name like any other.
  std::ofstream(dir_ / "root" / "a..b") << "x";
  EXPECT_TRUE(box->Resolve("a..b").ok());
}

// A root of "/" serves every file by its path without the leading '/'
// (it refused every one: no path starts with "/" + "/").
TEST_F(SandboxTest, RootOfSlashServesEveryFileAndStillRefusesDotDot) {
  auto box = Sandbox::Open("/");
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  EXPECT_EQ(box->root(), "/");
  const std::string name = real_.substr(1) + "/root/sub/f.bin";
  auto p = box->Resolve(name);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, real_ + "/root/sub/f.bin");
  EXPECT_EQ(box->Resolve(real_.substr(1) + "/root/out-link").value(), real_ + "/secret");
  EXPECT_EQ(box->Resolve("../" + name).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(box->Resolve("/" + name).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(box->Resolve(".").status().code(), Code::kInvalidArgument);  // the root itself
}

TEST_F(SandboxTest, AFileRootServesOnlyItsBaseName) {
  auto box = Sandbox::Open((dir_ / "root" / "sub" / "f.bin").string());
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  EXPECT_EQ(box->Resolve("f.bin").value(), real_ + "/root/sub/f.bin");
  EXPECT_EQ(box->Resolve("sub/f.bin").status().code(), Code::kNotFound);
  EXPECT_EQ(box->Resolve("../secret").status().code(), Code::kNotFound);
}

TEST_F(SandboxTest, OpenRefusesMissingRootsAndSpecialFiles) {
  EXPECT_EQ(Sandbox::Open((dir_ / "missing").string()).status().code(), Code::kNotFound);
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(Sandbox::Open((dir_ / "fifo").string()).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace tern::xfer
