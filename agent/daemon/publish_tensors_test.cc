// ViewOfTensors (publish_tensors.h): every refusal names the tensor and says
// what is wrong; a valid set becomes a sorted view over the caller's bytes.
#include "agent/daemon/publish_tensors.h"

#include <gtest/gtest.h>

#include "tern/digest.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tern::agent {
namespace {

class PublishTensorsTest : public ::testing::Test {
 protected:
  PublishTensorsTest() : a_(12, 1), b_(4 * 2, 2) {
    tensors_ = {{"w.b", DType::kF32, {2}, b_.data(), b_.size()},
                {"w.a", DType::kBF16, {2, 3}, a_.data(), a_.size()}};
  }
  // The error of ViewOfTensors (Ok when it succeeds).
  Status Check(const ServeView* served = nullptr) {
    auto v = ViewOfTensors(tensors_, served);
    return v.ok() ? Status::Ok() : v.status();
  }
  std::vector<uint8_t> a_, b_;
  std::vector<PublishTensor> tensors_;
};

void ExpectRefused(const Status& s, Code code, const std::string& part) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(part), std::string::npos) << s.ToString() << " lacks " << part;
}

TEST_F(PublishTensorsTest, SortsByNameAndBorrowsTheBytes) {
  auto v = ViewOfTensors(tensors_, nullptr);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ((*v)->view.tensors.size(), 2u);
  EXPECT_EQ((*v)->view.tensors[0].desc->name, "w.a");
  EXPECT_EQ((*v)->view.tensors[0].data, a_.data());
  EXPECT_EQ((*v)->view.tensors[1].desc->name, "w.b");
  EXPECT_EQ((*v)->view.tensors[1].desc->dtype, DType::kF32);
  EXPECT_EQ((*v)->view.total_bytes(), a_.size() + b_.size());
}

TEST_F(PublishTensorsTest, RefusesBadTensorsAlone) {
  ExpectRefused(ViewOfTensors({}, nullptr).status(), Code::kInvalidArgument, "no tensors");
  tensors_[0].data = nullptr;
  ExpectRefused(Check(), Code::kInvalidArgument, "tensor w.b has a null data pointer");
  tensors_[0].data = b_.data();
  tensors_[1].bytes = 11;
  ExpectRefused(Check(), Code::kInvalidArgument, "tensor w.a has 11 bytes, but BF16 [2, 3] is 12");
  tensors_[1].bytes = 12;
  tensors_[1].name = "";
  ExpectRefused(Check(), Code::kInvalidArgument, "empty name");
  tensors_[1].name = "w.b";
  ExpectRefused(Check(), Code::kInvalidArgument, "tensor w.b is given twice");
  tensors_[1].name = "w.a";
  tensors_[1].dtype = static_cast<DType>(250);
  ExpectRefused(Check(), Code::kInvalidArgument, "tensor w.a has an unknown dtype");
  tensors_[1].dtype = DType::kBF16;
  tensors_[1].shape = {uint64_t{1} << 62, 16};
  ExpectRefused(Check(), Code::kInvalidArgument, "tensor w.a shape");
  tensors_[1].shape = std::vector<uint64_t>(9, 1);
  ExpectRefused(Check(), Code::kInvalidArgument, "tensor w.a has 9 dimensions");
  tensors_[1].shape = {2, 3};
  EXPECT_TRUE(Check().ok());
}

TEST_F(PublishTensorsTest, RefusesAnotherLayoutThanTheServedOne) {
  auto first = ViewOfTensors(tensors_, nullptr);
  ASSERT_TRUE(first.ok());
  const ServeView& served = (*first)->view;
  std::vector<uint8_t> c(4, 3);
  tensors_.push_back({"w.c", DType::kU8, {4}, c.data(), c.size()});
  ExpectRefused(Check(&served), Code::kMismatch, "tensor w.c is not in the served layout");
  tensors_.pop_back();
  tensors_.pop_back();
  ExpectRefused(Check(&served), Code::kMismatch, "tensor w.a of the served layout is missing");
  tensors_.push_back({"w.a", DType::kF16, {2, 3}, a_.data(), a_.size()});
  ExpectRefused(Check(&served), Code::kMismatch, "tensor w.a is F16, the served layout has BF16");
  tensors_.back() = {"w.a", DType::kBF16, {3, 2}, a_.data(), a_.size()};
  ExpectRefused(Check(&served), Code::kMismatch,
                "tensor w.a has shape [3, 2], the served layout has [2, 3]");
  tensors_.back().shape = {2, 3};
  EXPECT_TRUE(Check(&served).ok());
}

// DigestOfTensors (tern/agent.h): the digest of the same view by the
// per-tensor route, whatever order the tensors come in; one changed bit
// moves it; refusals say "view_digest".
TEST_F(PublishTensorsTest, DigestOfTensorsIsTheViewsDigest) {
  const TensorDesc da{"w.a", DType::kBF16, {2, 3}}, db{"w.b", DType::kF32, {2}};
  ViewDigest want = ComputeTensorDigest({&da, a_.data()});
  want += ComputeTensorDigest({&db, b_.data()});
  auto d = DigestOfTensors(tensors_, 2);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, want);
  std::swap(tensors_[0], tensors_[1]);
  EXPECT_EQ(*DigestOfTensors(tensors_), want);
  a_[5] ^= 0x10;
  EXPECT_NE(*DigestOfTensors(tensors_), want);
  tensors_[1].name = "w.a";
  ExpectRefused(DigestOfTensors(tensors_).status(), Code::kInvalidArgument,
                "view_digest: tensor w.a is given twice");
}

}  // namespace
}  // namespace tern::agent
