// Shared plumbing of the quantizers (quantize*.cc). Internal.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "tern/quantize.h"

namespace tern::quant {

static_assert(std::endian::native == std::endian::little,
              "tensor bytes are little-endian; add byte swaps for big-endian hosts");

// shape = [lead..., out, in]; lead is the product of the leading dims.
struct Dims {
  uint64_t lead = 1;
  uint64_t out = 0;
  uint64_t in = 0;
  uint64_t count = 0;  // lead * out * in
};

Result<Dims> CheckShape(const std::vector<uint64_t>& shape);
// kInvalidArgument naming the first NaN/Inf element.
Status CheckFinite(const float* x, uint64_t n);

// ScalePolicy on one group: the scale to use given the fresh one and the
// previous (decoded) one, if any. *kept says whether `prev` was reused.
inline float ChooseScale(float fresh, const float* prev, const ScalePolicy& policy, bool* kept) {
  *kept = false;
  if (policy.kind != ScalePolicy::Kind::kBand) return fresh;
  if (prev != nullptr && *prev > 0.0f && fresh <= *prev && fresh >= policy.band_low * *prev) {
    *kept = true;
    return *prev;
  }
  return fresh * policy.headroom;
}

// The keep half of ChooseScale, for formats whose stored scale is not the
// FP32 scale itself (they re-derive it from amax * RescaleFactor()).
inline bool KeepPrevious(float fresh, float prev, const ScalePolicy& policy) {
  return policy.kind == ScalePolicy::Kind::kBand && prev > 0.0f && fresh <= prev &&
         fresh >= policy.band_low * prev;
}
inline float RescaleFactor(const ScalePolicy& policy) {
  return policy.kind == ScalePolicy::Kind::kBand ? policy.headroom : 1.0f;
}

QuantTensor NewTensor(std::string_view suffix, DType dtype, std::vector<uint64_t> shape);

// The tensor `suffix` of the previous state, checked against the expected
// dtype and shape (kMismatch otherwise); null when there is no previous state.
Result<const QuantTensor*> FindPrevious(const Quantized* previous, std::string_view suffix,
                                        DType dtype, const std::vector<uint64_t>& shape);
// The tensor `suffix` of q, checked like FindPrevious but kCorrupt and never null.
Result<const QuantTensor*> FindChecked(const Quantized& q, std::string_view suffix, DType dtype,
                                       const std::vector<uint64_t>& shape);

template <class T>
T Load(const QuantTensor& t, uint64_t i) {
  T v;
  std::memcpy(&v, t.data.data() + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void Store(QuantTensor& t, uint64_t i, T v) {
  std::memcpy(t.data.data() + i * sizeof(T), &v, sizeof(T));
}

// Largest |x| of n values (master values are finite by then).
float AbsMax(const float* x, uint64_t n);

// The stored per-tensor scale a format with one (HasTensorScale) uses:
// `shared` if given (checked to cover `amax`, this tensor's), else
// TensorScale from `amax` and `previous` (the last stored value, or null).
// *kept: the result is bitwise the previous stored value.
Result<float> ChooseTensorScale(const QuantSpec& spec, float amax, const float* previous,
                                const float* shared, const ScalePolicy& policy, bool* kept);

Result<Quantized> QuantizeFp8(const QuantSpec& spec, const float* master,
                              const std::vector<uint64_t>& shape, const Dims& d,
                              const Quantized* previous, const ScalePolicy& policy,
                              const float* tensor_scale);
Result<std::vector<float>> DequantizeFp8(const QuantSpec& spec, const Quantized& q,
                                         const std::vector<uint64_t>& shape, const Dims& d);
Result<Quantized> QuantizeFp4(const QuantSpec& spec, const float* master,
                              const std::vector<uint64_t>& shape, const Dims& d,
                              const Quantized* previous, const ScalePolicy& policy,
                              const float* tensor_scale);
Result<std::vector<float>> DequantizeFp4(const QuantSpec& spec, const Quantized& q,
                                         const std::vector<uint64_t>& shape, const Dims& d);
Result<Quantized> QuantizeInt4(const QuantSpec& spec, const float* master,
                               const std::vector<uint64_t>& shape, const Dims& d,
                               const Quantized* previous, const ScalePolicy& policy);
Result<std::vector<float>> DequantizeInt4(const QuantSpec& spec, const Quantized& q,
                                          const std::vector<uint64_t>& shape, const Dims& d);

}  // namespace tern::quant
