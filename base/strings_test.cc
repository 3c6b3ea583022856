#include "base/strings.h"

#include <gtest/gtest.h>

namespace tern {
namespace {

TEST(SplitCommas, ItemsInOrderEmptyOnesDropped) {
  using V = std::vector<std::string>;
  EXPECT_EQ(SplitCommas("a,b,c"), (V{"a", "b", "c"}));
  EXPECT_EQ(SplitCommas("a,,b,"), (V{"a", "b"}));
  EXPECT_EQ(SplitCommas(",lm_head"), (V{"lm_head"}));
  EXPECT_EQ(SplitCommas(" a , b"), (V{" a ", " b"}));  // no trimming: names are exact
  EXPECT_EQ(SplitCommas(""), V{});
  EXPECT_EQ(SplitCommas(",,,"), V{});
}

}  // namespace
}  // namespace tern
