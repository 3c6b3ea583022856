// Defaults shared by every backend.
#include <cstdio>

#include <xxhash.h>

#include "tern/transport.h"
#include "transport/internal.h"

namespace tern {

Result<std::string> Connection::ExportRegion(const MemoryRegion&) {
  return TERN_ERROR(kUnsupported, "this transport has no one-sided writes");
}

void Connection::Write(const MemoryRegion&, uint64_t, std::string_view, uint64_t, uint64_t,
                       Completion done) {
  transport_internal::Complete(done, TERN_ERROR(kUnsupported, "this transport has no one-sided writes"));
}

namespace transport_internal {
uint64_t Xxh3(const void* data, uint64_t size_bytes) {
  return XXH3_64bits(data, static_cast<size_t>(size_bytes));
}
void LogLine(const LogFn& log, std::string_view line) {
  if (log) {
    log(line);
  } else {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  }
}
Status CheckWriteRanges(std::string_view backend, const MemoryRegion& src, uint64_t src_offset,
                        uint64_t exported_bytes, uint64_t dst_offset, uint64_t length) {
  TERN_REQUIRE(length != 0 && src_offset <= src.size_bytes && length <= src.size_bytes - src_offset,
               kInvalidArgument, backend, ": write source outside its registered region");
  TERN_REQUIRE(dst_offset <= exported_bytes && length <= exported_bytes - dst_offset, kOutOfRange,
               backend, ": write [", dst_offset, ", +", length, ") outside the exported region of ",
               exported_bytes, " bytes");
  return Status::Ok();
}

std::string Printable(std::string_view bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    if (b >= 0x20 && b < 0x7f && b != '\\') {
      out.push_back(c);
    } else {
      out += "\\x";
      out.push_back(kHex[b >> 4]);
      out.push_back(kHex[b & 15]);
    }
  }
  return out;
}
}  // namespace transport_internal

}  // namespace tern
