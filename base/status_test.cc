#include "tern/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace tern {
namespace {

Status Fails() { return TERN_ERROR(kCorrupt, "segment ", 3, " is short"); }
Result<int> Half(int x) {
  TERN_REQUIRE(x % 2 == 0, kInvalidArgument, x, " is odd");
  return x / 2;
}
Result<int> Quarter(int x) {
  TERN_ASSIGN_OR_RETURN(int h, Half(x));
  TERN_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}
Status Chain() {
  TERN_RETURN_IF_ERROR(Fails());
  return Status::Ok();
}

TEST(Status, OkIsCheapAndEmpty) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Code::kOk);
  EXPECT_EQ(s.ToString(), "ok");
  EXPECT_EQ(sizeof(Status), sizeof(void*));
}

TEST(Status, ErrorCarriesCodeAndLocation) {
  Status s = Fails();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("status_test.cc:"), std::string::npos);
  EXPECT_NE(s.message().find("segment 3 is short"), std::string::npos);
  EXPECT_EQ(s.ToString().rfind("corrupt: ", 0), 0u);
  Status copy = s;
  EXPECT_EQ(copy.ToString(), s.ToString());
  EXPECT_EQ(Chain().code(), Code::kCorrupt);
  EXPECT_EQ(s.WithContext("reading p").message().rfind("reading p: ", 0), 0u);
}

TEST(Status, ResultPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("3 is odd"), std::string::npos);
}

TEST(Status, ErrnoMapsCodes) {
  errno = ENOENT;
  Status s = TERN_ERRNO("open /x");
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_NE(s.message().find("open /x: "), std::string::npos);
}

TEST(Status, ResultFromOkStatusIsAnError) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInternal);
}

}  // namespace
}  // namespace tern
