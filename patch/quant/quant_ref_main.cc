// tern_quant_ref: streams raw little-endian arrays through tern's casts so
// the Python reference tests (tests/python/test_cast_*.py, test_quant_*.py)
// can compare them bit for bit with PyTorch and ml_dtypes.
//
//   tern_quant_ref OP < input > output
//   OP: f32-to-bf16 | f32-to-f16 (F32 in, 16-bit codes out)
//       bf16-to-f32 | f16-to-f32 (16-bit codes in, F32 out)
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tern/quant.h"

namespace {

std::vector<unsigned char> ReadAll(FILE* f) {
  std::vector<unsigned char> data;
  unsigned char buf[1 << 16];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + got);
  return data;
}

int Fail(const std::string& msg) {
  fprintf(stderr, "tern_quant_ref: %s\n", msg.c_str());
  return 2;
}

template <class In, class Out, class Fn>
int Run(const std::vector<unsigned char>& data, Fn fn) {
  if (data.size() % sizeof(In) != 0) return Fail("input size is not a multiple of the element size");
  const uint64_t n = data.size() / sizeof(In);
  std::vector<In> in(n);
  if (n) std::memcpy(in.data(), data.data(), data.size());
  std::vector<Out> out(n);
  fn(in.data(), out.data(), n);
  if (n && fwrite(out.data(), sizeof(Out), n, stdout) != n) return Fail("write failed");
  return fflush(stdout) == 0 ? 0 : Fail("flush failed");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return Fail("usage: tern_quant_ref OP < in > out");
  const std::string op = argv[1];
  const std::vector<unsigned char> data = ReadAll(stdin);
  if (op == "f32-to-bf16") return Run<float, uint16_t>(data, tern::CastF32ToBF16);
  if (op == "f32-to-f16") return Run<float, uint16_t>(data, tern::CastF32ToF16);
  if (op == "bf16-to-f32") return Run<uint16_t, float>(data, tern::CastBF16ToF32);
  if (op == "f16-to-f32") return Run<uint16_t, float>(data, tern::CastF16ToF32);
  return Fail("unknown op '" + op + "'");
}
