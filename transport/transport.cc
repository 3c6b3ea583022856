// Defaults shared by every backend.
#include "tern/transport.h"
#include "transport/internal.h"

namespace tern {

Result<std::string> Connection::ExportRegion(const MemoryRegion&) {
  return TERN_ERROR(kUnsupported, "this transport has no one-sided writes");
}

void Connection::Write(const MemoryRegion&, uint64_t, std::string_view, uint64_t, uint64_t,
                       Completion done) {
  transport::Complete(done, TERN_ERROR(kUnsupported, "this transport has no one-sided writes"));
}

namespace transport {

Status CheckWriteRanges(std::string_view backend, const MemoryRegion& src, uint64_t src_offset,
                        uint64_t exported_bytes, uint64_t dst_offset, uint64_t length) {
  TERN_REQUIRE(length != 0 && src_offset <= src.size_bytes && length <= src.size_bytes - src_offset,
               kInvalidArgument, backend, ": write source outside its registered region");
  TERN_REQUIRE(dst_offset <= exported_bytes && length <= exported_bytes - dst_offset, kOutOfRange,
               backend, ": write [", dst_offset, ", +", length, ") outside the exported region of ",
               exported_bytes, " bytes");
  return Status::Ok();
}

}  // namespace transport

}  // namespace tern
