// Fuzzer: arbitrary bytes as an etcd gateway reply (agent/etcd/etcd_json.h) and
// as base64. The decoders must refuse or return what the bytes say, never
// crash or read out of bounds; base64 that decodes re-encodes to the same
// text (the decoder is canonical; URL-safe input maps to the standard
// alphabet).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "agent/etcd/etcd_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  using namespace tern::agent;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (size > (1 << 20)) return 0;

  auto decoded = Base64Decode(in);
  if (decoded.ok()) {
    std::string standard(in);
    for (char& c : standard) {
      if (c == '-') c = '+';
      if (c == '_') c = '/';
    }
    TERN_ASSERT(Base64Encode(*decoded) == standard, "base64 decode is not canonical");
  }

  const nlohmann::json reply = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded()) return 0;
  auto range = ParseRange(reply, 16);
  if (range.ok()) {
    TERN_ASSERT(range->kvs.size() <= 16);
    for (const EtcdKeyValue& kv : range->kvs) TERN_ASSERT(!kv.key.empty());
  }
  HeaderRevision(reply).status().IgnoreError();
  for (const char* name : {"revision", "TTL", "ID", "deleted", "count"}) {
    Int64Field(reply, name).status().IgnoreError();
  }
  BoolField(reply, "succeeded").status().IgnoreError();
  if (reply.is_object() && reply.contains("result")) {
    Int64Field(reply["result"], "TTL").status().IgnoreError();
  }
  return 0;
}
