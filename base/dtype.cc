#include "tern/dtype.h"

namespace tern {
namespace {
struct Info {
  DType dtype;
  std::string_view name;
  int bits;
};
constexpr Info kInfo[kDTypeCount] = {
    {DType::kBool, "BOOL", 8},      {DType::kU8, "U8", 8},       {DType::kI8, "I8", 8},
    {DType::kF8E5M2, "F8_E5M2", 8}, {DType::kF8E4M3, "F8_E4M3", 8}, {DType::kF8E8M0, "F8_E8M0", 8},
    {DType::kI16, "I16", 16},       {DType::kU16, "U16", 16},    {DType::kF16, "F16", 16},
    {DType::kBF16, "BF16", 16},     {DType::kI32, "I32", 32},    {DType::kU32, "U32", 32},
    {DType::kF32, "F32", 32},       {DType::kF64, "F64", 64},    {DType::kI64, "I64", 64},
    {DType::kU64, "U64", 64},       {DType::kF4, "F4", 4},
};
}  // namespace

bool DTypeValid(uint8_t code) { return code < kDTypeCount; }
int ElementBits(DType dtype) { return kInfo[static_cast<int>(dtype)].bits; }
std::string_view DTypeName(DType dtype) { return kInfo[static_cast<int>(dtype)].name; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const Info& info : kInfo)
    if (info.name == name) return info.dtype;
  return std::nullopt;
}

uint64_t DTypeBytes(DType dtype, uint64_t elements) {
  const uint64_t bits = static_cast<uint64_t>(ElementBits(dtype));
  if (bits == 4) return elements / 2 + (elements & 1);
  return elements * (bits / 8);
}

}  // namespace tern
