#include "base/hash.h"

#include <xxhash.h>

namespace tern {

uint64_t Xxh3(const void* data, uint64_t size_bytes) {
  return XXH3_64bits(data, static_cast<size_t>(size_bytes));
}

}  // namespace tern
