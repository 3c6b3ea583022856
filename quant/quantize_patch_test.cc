// Every quantized layout is an ordinary set of segments for the codec: one
// RL-like step diffs and applies back bit for bit, packed nibbles and scale
// tensors included.
#include <gtest/gtest.h>

#include <random>

#include "tern/thread_pool.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tern/quantize.h"

namespace tern {
namespace {

std::vector<TensorDesc> Descs(const Quantized& q) {
  std::vector<TensorDesc> d;
  for (const QuantTensor& t : q.tensors) d.push_back({"layer.w" + t.suffix, t.dtype, t.shape});
  return d;
}

TEST(QuantizePatchTest, EveryFormatRoundTripsThroughDiffAndApply) {
  ThreadPool pool(2);
  const uint64_t out = 64, in = 256;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(out * in);
  for (float& x : w) x = dist(rng);
  std::vector<float> w1 = w;
  for (float& x : w1) x += 1e-4f * dist(rng) / 0.02f;
  w1[17] *= 3;  // forces one group to re-scale
  for (const std::string& fmt : QuantFormatNames()) {
    const QuantSpec spec = *ParseQuantFormat(fmt);
    auto q0 = Quantize(spec, w.data(), {out, in}, nullptr, {});
    ASSERT_TRUE(q0.ok()) << fmt << ": " << q0.status().ToString();
    auto q1 = Quantize(spec, w1.data(), {out, in}, &*q0, {});
    ASSERT_TRUE(q1.ok()) << fmt;
    std::vector<TensorDesc> d0 = Descs(*q0), d1 = Descs(*q1);
    Quantized target = *q1;
    Quantized work = *q0;
    ServeView v0, v1;
    MutableServeView mv;
    for (size_t i = 0; i < d0.size(); ++i) {
      v0.tensors.push_back({&d0[i], q0->tensors[i].data.data()});
      v1.tensors.push_back({&d1[i], target.tensors[i].data.data()});
      mv.tensors.push_back({&d0[i], work.tensors[i].data.data()});
    }
    ASSERT_TRUE(SortAndCheck(v0).ok() && SortAndCheck(v1).ok() && SortAndCheck(mv).ok());
    auto patch = Diff(v0, v1, {}, pool);
    ASSERT_TRUE(patch.ok()) << fmt << ": " << patch.status().ToString();
    ASSERT_TRUE(Apply(mv, *patch, ComputeDigest(v0, pool), pool).ok()) << fmt;
    bool changed = false;
    for (size_t i = 0; i < work.tensors.size(); ++i) {
      EXPECT_EQ(work.tensors[i].data, target.tensors[i].data) << fmt << " " << work.tensors[i].suffix;
      changed |= q0->tensors[i].data != target.tensors[i].data;
    }
    EXPECT_TRUE(changed) << fmt << ": the step should change some codes";
  }
}

}  // namespace
}  // namespace tern
