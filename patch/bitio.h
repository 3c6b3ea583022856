// The segment codec's bit streams (spec "Bit streams"): format/bit_stream.h's
// reader and writer, the writer appending to a growing byte vector.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "format/bit_stream.h"

namespace tern::patch {

using format::BitReader;

// A format::BitWriter sink over a std::vector (appends; Size() is the
// vector's whole size, so callers measure parts by differences).
struct VectorSink {
  std::vector<uint8_t>* out;
  uint64_t Size() const { return out->size(); }
  void Push(uint8_t b) { out->push_back(b); }
  void Append32(uint32_t v) {
    const size_t at = out->size();
    out->resize(at + 4);
    std::memcpy(out->data() + at, &v, 4);
  }
};

class BitWriter : private VectorSink, public format::BitWriter<VectorSink> {
 public:
  explicit BitWriter(std::vector<uint8_t>* out)
      : VectorSink{out}, format::BitWriter<VectorSink>(static_cast<VectorSink*>(this)) {}
  BitWriter(const BitWriter&) = delete;
  BitWriter& operator=(const BitWriter&) = delete;
};

}  // namespace tern::patch
