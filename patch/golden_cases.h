// The golden patch cases (tests/golden/): layouts shared by the one-off
// generator (patch/golden_gen.cc) and the test that must decode the committed
// files forever (tests/golden/golden_test.cc). Never change an existing case:
// add new ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tern/dtype.h"

namespace tern::golden {

struct GoldenTensor {
  const char* name;
  DType dtype;
  std::vector<uint64_t> shape;
};

struct GoldenCase {
  const char* file;  // tests/golden/<file>.{base,target,patch}
  std::vector<GoldenTensor> tensors;  // sorted by name; .base/.target concatenate their bytes
  double density;                     // generator only
  uint64_t segment_elements;          // generator only
  uint16_t format = 1;                // the patch's format version
  double push = 0;                    // generator only: > 0, float tensors follow testing::PhysicalStep
  bool nibble_steps = false;          // generator only: integer tensors follow testing::MutateNibbles
};

inline std::vector<GoldenCase> Cases() {
  return {
      {"bf16_sparse", {{"layer.0.w", DType::kBF16, {8, 16}}}, 0.05, 64},
      {"f32_sparse", {{"w", DType::kF32, {40}}}, 0.1, 1 << 20},
      {"u8_dense", {{"codes", DType::kU8, {48}}}, 0.9, 1 << 20},
      {"f4_dense", {{"fp4", DType::kF4, {2, 25}}}, 0.8, 32},
      {"f64_raw", {{"x", DType::kF64, {6}}}, -1.0, 1 << 20},  // density < 0: random new values
      {"mixed",
       {{"a.bf16", DType::kBF16, {33}}, {"b.f4", DType::kF4, {7}}, {"c.u64", DType::kU64, {2}},
        {"d.empty", DType::kF16, {0}}},
       0.2,
       16},
      // Format 2 (CONTEXT segments, which decode only against the base).
      {"bf16_context", {{"layer.0.w", DType::kBF16, {128, 128}}}, 0, 1 << 20, 2, 0.01},
      {"f8_context", {{"q", DType::kF8E4M3, {8192}}}, 0, 1 << 20, 2, 0.05},
      {"mixed_v2",
       {{"a.bf16", DType::kBF16, {3000}}, {"b.f4", DType::kF4, {64}}, {"c.u8", DType::kU8, {100}},
        {"d.f32", DType::kF32, {2000}}},
       0.1,
       2048,
       2,
       0.05},
      // Format 3 (written by a format-2 writer): packed 4-bit codes coded
      // as nibbles, two a U8 and eight an I32, beside a tensor coded by
      // elements.
      {"packed_nibbles",
       {{"a.codes", DType::kU8, {4, 40}}, {"b.qweight", DType::kI32, {60}}, {"c.f32", DType::kF32, {30}}},
       0.1,
       64,
       3,
       0,
       true},
  };
}

}  // namespace tern::golden
