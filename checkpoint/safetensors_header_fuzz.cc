// Fuzzes the safetensors header parser with the input as a whole file. On
// success, the layout it accepted must be self-consistent and must survive a
// write/parse round trip with the same tensors.
#include <cstdint>
#include <cstring>
#include <vector>

#include "checkpoint/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  auto parsed = checkpoint::ParseHeader({data, size}, size);
  if (!parsed.ok()) return 0;
  uint64_t end = 0;
  std::vector<checkpoint::PlacedTensor> placed;
  for (const auto& t : parsed->tensors) {
    TERN_ASSERT(t.begin_bytes == end && t.end_bytes >= t.begin_bytes);
    TERN_ASSERT(t.end_bytes - t.begin_bytes == t.desc.bytes());
    end = t.end_bytes;
    placed.push_back({&t.desc, t.begin_bytes, t.end_bytes});
  }
  TERN_ASSERT(parsed->data_offset_bytes() + end == size);
  auto header = checkpoint::SerializeHeader(parsed->metadata, placed);
  TERN_ASSERT(header.ok(), header.status().ToString());
  std::vector<uint8_t> file(header->begin(), header->end());
  file.resize(file.size() + end);
  auto again = checkpoint::ParseHeader(file, file.size());
  TERN_ASSERT(again.ok(), again.status().ToString());
  TERN_ASSERT(again->tensors.size() == parsed->tensors.size());
  TERN_ASSERT(again->metadata == parsed->metadata);
  for (size_t i = 0; i < again->tensors.size(); ++i)
    TERN_ASSERT(again->tensors[i].desc.SameLayout(parsed->tensors[i].desc));
  return 0;
}
