// XXH3-64: the checksum of every chunk on every wire (transport.h), of xfer
// files and of patch records. One wrapper, so callers need no xxhash include.
#pragma once

#include <cstdint>

namespace tern {

uint64_t Xxh3(const void* data, uint64_t size_bytes);

}  // namespace tern
