// CPU cost of validating one safetensors header (ParseHeader: JSON, schema,
// layout checks), per tensor, for the record of docs/benchmarks-journal.md
// ("Safetensors header parse"). The header is built here as plain text, so
// the same source measures any version of the parser.
//
//   header_parse_bench [tensors=10000] [reps=20]
//
// Prints the header size and the median, min and max CPU ms of `reps` parses,
// plus the ns per header byte.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/safetensors_header.h"

namespace {

double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Names and shapes like a MoE model's: long dotted names, rank 2-3.
std::string Header(uint64_t tensors, uint64_t* data_bytes) {
  std::string json = R"({"__metadata__":{"format":"pt"})";
  uint64_t offset = 0;
  for (uint64_t i = 0; i < tensors; ++i) {
    const uint64_t rows = 64 + i % 7, cols = 128;
    const uint64_t bytes = rows * cols * 2;
    json += ",\"model.layers." + std::to_string(i / 64) + ".mlp.experts." +
            std::to_string(i % 64) + ".down_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[" +
            std::to_string(rows) + "," + std::to_string(cols) + "],\"data_offsets\":[" +
            std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  json += "}";
  json.resize((json.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  *data_bytes = offset;
  return out + json;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t tensors = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 10000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  uint64_t data_bytes = 0;
  const std::string header = Header(tensors, &data_bytes);
  // Only the header is in memory: ParseHeader reads the first 8 + N bytes
  // and is told the file's full size.
  const std::span<const uint8_t> file(reinterpret_cast<const uint8_t*>(header.data()),
                                      header.size());
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const double c0 = CpuNow();
    auto parsed = tern::checkpoint::ParseHeader(file, header.size() + data_bytes);
    ms.push_back((CpuNow() - c0) * 1e3);
    if (!parsed.ok() || parsed->tensors.size() != tensors) {
      std::fprintf(stderr, "header_parse_bench: %s\n", parsed.status().ToString().c_str());
      return 1;
    }
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  std::printf("tensors=%llu header_bytes=%zu median_ms=%.3f min_ms=%.3f max_ms=%.3f "
              "ns_per_byte=%.2f us_per_tensor=%.3f\n",
              static_cast<unsigned long long>(tensors), header.size() - 8, median, ms.front(),
              ms.back(), median * 1e6 / static_cast<double>(header.size() - 8),
              median * 1e3 / static_cast<double>(tensors));
  return 0;
}
