// tern_quant_ref: streams raw little-endian arrays through tern's casts so
// the Python reference tests (tests/python/test_cast_*.py, test_quant_*.py)
// can compare them bit for bit with PyTorch and ml_dtypes.
//
//   tern_quant_ref OP < input > output
//   OP: f32-to-bf16 | f32-to-f16 (F32 in, 16-bit codes out)
//       bf16-to-f32 | f16-to-f32 (16-bit codes in, F32 out)
//       f32-to-e4m3 | f32-to-e5m2 (F32 in, one code byte out; overflow to
//       NaN / Inf as PyTorch and ml_dtypes) | f32-to-e2m1 (saturating)
//       e4m3-to-f32 | e5m2-to-f32 | e2m1-to-f32 | e8m0-to-f32 (bytes in)
//   tern_quant_ref quantize FORMAT DIM... < f32 > tensors
//       quantizes with ScalePolicy::kFresh (the reference arithmetic) and
//       writes each output tensor as a text line "suffix dtype d0,d1,.. nbytes"
//       followed by its raw bytes.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "quant/minifloat.h"
#include "tern/float_cast.h"
#include "tern/quantize.h"

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

template <class Fn>
int Bytes(const std::vector<unsigned char>& data, size_t in_size, size_t out_size, Fn fn) {
  if (data.size() % in_size != 0) return Fail("input size is not a multiple of the element size");
  const uint64_t n = data.size() / in_size;
  std::vector<unsigned char> out(n * out_size);
  for (uint64_t i = 0; i < n; ++i) fn(data.data() + i * in_size, out.data() + i * out_size);
  if (!out.empty() && fwrite(out.data(), 1, out.size(), stdout) != out.size()) return Fail("write failed");
  return fflush(stdout) == 0 ? 0 : Fail("flush failed");
}

int Encode(const std::vector<unsigned char>& data, const tern::quant::MiniFloat& f, bool saturate) {
  return Bytes(data, 4, 1, [&](const unsigned char* in, unsigned char* out) {
    float x;
    std::memcpy(&x, in, 4);
    *out = tern::quant::EncodeMini(x, f, saturate);
  });
}

template <class Fn>
int Decode(const std::vector<unsigned char>& data, Fn fn) {
  return Bytes(data, 1, 4, [&](const unsigned char* in, unsigned char* out) {
    const float x = fn(*in);
    std::memcpy(out, &x, 4);
  });
}

int QuantizeOp(int argc, char** argv, const std::vector<unsigned char>& data) {
  if (argc < 5) return Fail("usage: tern_quant_ref quantize FORMAT DIM DIM... < f32");
  auto spec = tern::ParseQuantFormat(argv[2]);
  if (!spec.ok()) return Fail(spec.status().ToString());
  std::vector<uint64_t> shape;
  uint64_t n = 1;
  for (int i = 3; i < argc; ++i) {
    shape.push_back(std::stoull(argv[i]));
    n *= shape.back();
  }
  if (data.size() != n * 4) return Fail("input is not DIMs float32 values");
  std::vector<float> master(n);
  std::memcpy(master.data(), data.data(), data.size());
  tern::ScalePolicy fresh;
  fresh.kind = tern::ScalePolicy::Kind::kFresh;
  auto q = tern::Quantize(*spec, master.data(), shape, nullptr, fresh);
  if (!q.ok()) return Fail(q.status().ToString());
  for (const tern::QuantTensor& t : q->tensors) {
    std::string dims;
    for (uint64_t d : t.shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    printf("%s %s %s %zu\n", t.suffix.c_str(), std::string(tern::DTypeName(t.dtype)).c_str(),
           dims.c_str(), t.data.size());
    if (!t.data.empty() && fwrite(t.data.data(), 1, t.data.size(), stdout) != t.data.size())
      return Fail("write failed");
  }
  return fflush(stdout) == 0 ? 0 : Fail("flush failed");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tern::quant;
  if (argc < 2) return Fail("usage: tern_quant_ref OP < in > out");
  const std::string op = argv[1];
  const std::vector<unsigned char> data = ReadAll(stdin);
  if (op == "quantize") return QuantizeOp(argc, argv, data);
  if (argc != 2) return Fail("usage: tern_quant_ref OP < in > out");
  if (op == "f32-to-e4m3") return Encode(data, kE4M3, false);
  if (op == "f32-to-e5m2") return Encode(data, kE5M2, false);
  if (op == "f32-to-e2m1") return Encode(data, kE2M1, true);
  if (op == "e4m3-to-f32") return Decode(data, [](uint8_t c) { return DecodeMini(c, kE4M3); });
  if (op == "e5m2-to-f32") return Decode(data, [](uint8_t c) { return DecodeMini(c, kE5M2); });
  if (op == "e2m1-to-f32") return Decode(data, [](uint8_t c) { return DecodeMini(c & 0xF, kE2M1); });
  if (op == "e8m0-to-f32") return Decode(data, DecodeE8M0);
  if (op == "f32-to-bf16") return Run<float, uint16_t>(data, tern::CastF32ToBF16);
  if (op == "f32-to-f16") return Run<float, uint16_t>(data, tern::CastF32ToF16);
  if (op == "bf16-to-f32") return Run<uint16_t, float>(data, tern::CastBF16ToF32);
  if (op == "f16-to-f32") return Run<uint16_t, float>(data, tern::CastF16ToF32);
  return Fail("unknown op '" + op + "'");
}
