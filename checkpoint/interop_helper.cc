// Test helper for tests/python/test_safetensors_interop.py: writes checkpoints
// with tern and dumps what tern reads, so the reference Python library can be
// checked against us in both directions.
//
//   safetensors_interop_helper write PATH [--reference-order] [--shard-bytes N] [--metadata K=V]...
//       Every DType as a [3, 4] tensor "t.<DTYPE>", plus "scalar" (F32, []) and
//       "empty" (BF16, [0, 7]); byte i of a tensor is (i * 37 + sum of its
//       name's bytes) mod 256, masked to 0/1 for BOOL.
//   safetensors_interop_helper dump PATH
//       One JSON object: files, per-file metadata, and every tensor with its
//       dtype, shape and bytes in hex.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "tern/checkpoint.h"

namespace tern {
namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
  return 1;
}

int Write(int argc, char** argv) {
  if (argc < 1) return Fail(TERN_ERROR(kInvalidArgument, "write needs a path"));
  const std::string path = argv[0];
  bool reference_order = false;
  CreateOptions options;
  std::map<std::string, std::string> metadata;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reference-order") {
      reference_order = true;
    } else if (arg == "--shard-bytes" && i + 1 < argc) {
      options.shard_bytes_max = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--metadata" && i + 1 < argc) {
      const std::string kv = argv[++i];
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) return Fail(TERN_ERROR(kInvalidArgument, "--metadata K=V"));
      metadata[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else {
      return Fail(TERN_ERROR(kInvalidArgument, "unknown argument ", arg));
    }
  }
  std::vector<TensorDesc> tensors;
  for (int code = 0; code < kDTypeCount; ++code) {
    const auto d = static_cast<DType>(code);
    tensors.push_back({"t." + std::string(DTypeName(d)), d, {3, 4}});
  }
  tensors.push_back({"scalar", DType::kF32, {}});
  tensors.push_back({"empty", DType::kBF16, {0, 7}});
  if (reference_order) SortLikeReferenceWriter(tensors);
  auto w = WritableCheckpoint::Create(path, std::move(tensors), metadata, options);
  if (!w.ok()) return Fail(w.status());
  for (auto& t : (*w)->view().tensors) {
    unsigned name_sum = 0;
    for (unsigned char c : t.desc->name) name_sum += c;
    for (uint64_t i = 0; i < t.desc->bytes(); ++i) {
      uint8_t v = static_cast<uint8_t>(i * 37 + name_sum);
      t.data[i] = t.desc->dtype == DType::kBool ? (v & 1) : v;
    }
  }
  Status s = (*w)->Commit();
  return s.ok() ? 0 : Fail(s);
}

int Dump(const std::string& path) {
  auto c = Checkpoint::Open(path);
  if (!c.ok()) return Fail(c.status());
  const Checkpoint& ckpt = **c;
  nlohmann::json metadata = nlohmann::json::object();
  for (const std::string& file : ckpt.files()) metadata[file] = ckpt.metadata(file);
  nlohmann::json tensors = nlohmann::json::array();
  static constexpr char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < ckpt.view().tensors.size(); ++i) {
    const TensorRef& t = ckpt.view().tensors[i];
    std::string hex;
    for (uint64_t k = 0; k < t.desc->bytes(); ++k) {
      hex += kHex[t.data[k] >> 4];
      hex += kHex[t.data[k] & 15];
    }
    tensors.push_back({{"name", t.desc->name},
                       {"dtype", DTypeName(t.desc->dtype)},
                       {"shape", t.desc->shape},
                       {"file", ckpt.locations()[i].file_index},
                       {"hex", std::move(hex)}});
  }
  const nlohmann::json dump = {{"sharded", ckpt.sharded()},
                               {"files", ckpt.files()},
                               {"metadata", std::move(metadata)},
                               {"tensors", std::move(tensors)}};
  // Names came through the strict reader: valid UTF-8, so dump cannot throw.
  const std::string out = dump.dump() + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace
}  // namespace tern

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "write") == 0) return tern::Write(argc - 2, argv + 2);
  if (argc == 3 && std::strcmp(argv[1], "dump") == 0) return tern::Dump(argv[2]);
  std::fprintf(stderr, "usage: %s write PATH [options] | dump PATH\n", argv[0]);
  return 2;
}
