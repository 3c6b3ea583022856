#include "patch/quant/quantize_internal.h"

namespace tern::quant_internal {

Result<Quantized> QuantizeFp4(const QuantSpec& spec, const float*, const std::vector<uint64_t>&,
                              const Dims&, const Quantized*, const ScalePolicy&) {
  return TERN_ERROR(kUnsupported, "format ", spec.name, " is not implemented yet");
}
Result<std::vector<float>> DequantizeFp4(const QuantSpec& spec, const Quantized&,
                                         const std::vector<uint64_t>&, const Dims&) {
  return TERN_ERROR(kUnsupported, "format ", spec.name, " is not implemented yet");
}

}  // namespace tern::quant_internal
