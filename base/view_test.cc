#include "tern/view.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace tern {
namespace {

std::vector<TensorDesc> Descs(int n) {
  std::vector<TensorDesc> d;
  for (int i = 0; i < n; ++i)
    d.push_back({"model.layers." + std::to_string(i % 7) + ".experts." + std::to_string(i) + ".w",
                 DType::kBF16,
                 {2}});
  d.push_back(
      {"\xff-high-byte", DType::kU8, {1}});  // byte-wise order: sorts after every ASCII name
  return d;
}

TEST(ViewTest, FindReturnsEveryTensorOfASortedViewAndNothingElse) {
  const std::vector<TensorDesc> descs = Descs(1000);
  ServeView view;
  for (const TensorDesc& d : descs) view.tensors.push_back({&d, nullptr});
  ASSERT_TRUE(SortAndCheck(view).ok());
  for (const TensorDesc& d : descs) {
    const TensorRef* t = view.Find(d.name);
    ASSERT_NE(t, nullptr) << d.name;
    EXPECT_EQ(t->desc, &d);
    EXPECT_EQ(view.FindSorted(d.name), t);
  }
  EXPECT_EQ(view.tensors.back().desc->name, "\xff-high-byte");  // byte-wise, as the search compares
  EXPECT_EQ(view.Find(""), nullptr);
  EXPECT_EQ(view.Find("model.layers.0.experts.0"), nullptr);  // a prefix of a name
  EXPECT_EQ(view.Find("model.layers.0.experts.0.w0"), nullptr);
  EXPECT_EQ(view.Find("\xff\xff"), nullptr);  // past the last
}

TEST(ViewTest, FindStillFindsTensorsOfAViewNeverSorted) {
  const std::vector<TensorDesc> descs = Descs(50);
  ServeView view;
  for (auto it = descs.rbegin(); it != descs.rend(); ++it) view.tensors.push_back({&*it, nullptr});
  std::swap(view.tensors[3], view.tensors[40]);
  int missed_by_the_search = 0;
  for (const TensorDesc& d : descs) {
    const TensorRef* t = view.Find(d.name);
    ASSERT_NE(t, nullptr) << d.name;
    EXPECT_EQ(t->desc, &d);
    missed_by_the_search += view.FindSorted(d.name) == nullptr;
  }
  EXPECT_GT(missed_by_the_search, 0);  // so the scan above is what found them
  EXPECT_EQ(view.Find("absent"), nullptr);
}

// Find asks the search before it scans: in this (unsorted, duplicated)
// order the search lands on the second "b" and the scan on the first.
TEST(ViewTest, FindSearchesBeforeItScans) {
  const TensorDesc b1{"b", DType::kU8, {1}}, a{"a", DType::kU8, {1}}, b2{"b", DType::kU8, {1}},
      c{"c", DType::kU8, {1}};
  ServeView view;
  for (const TensorDesc* d : {&b1, &a, &b2, &c}) view.tensors.push_back({d, nullptr});
  ASSERT_NE(view.FindSorted("b"), nullptr);
  EXPECT_EQ(view.FindSorted("b")->desc, &b2);
  EXPECT_EQ(view.Find("b")->desc, &b2);
}

}  // namespace
}  // namespace tern
