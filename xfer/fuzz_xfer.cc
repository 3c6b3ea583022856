// Fuzzer: arbitrary bytes as xfer protocol messages (docs/format/xfer.md)
// and as the client's resume-state file (xfer/xfer_wire.h). Input: one
// selector byte (mod 7: GET, INFO, WANT, ERROR/DONE, state, chunk count,
// HASH), then the message or file (for WANT, a u32 bitmap bound first; for
// chunk counts, two u64). Whatever decodes must re-encode to the
// same bytes (state files: to the same values) and stay inside its bounds;
// peer text must reach error messages escaped.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tern/status.h"
#include "tern/transport.h"
#include "base/coding.h"
#include "base/text.h"
#include "xfer/xfer_wire.h"

using tern::DecodeFixedAt;
using tern::IsPrintable;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  using namespace tern::xfer;
  if (size < 1) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 7) {
    case 0: {
      auto get = DecodeGet(in);
      if (get.ok()) {
        TERN_ASSERT(EncodeGet(*get) == in);
        TERN_ASSERT(get->chunk_bytes >= kMinChunkBytes && get->chunk_bytes <= kMaxChunkBytes &&
                    !get->name.empty() && get->name.size() <= kMaxNameBytes &&
                    get->transfer_id != 0 && get->access_token.size() <= kMaxAccessTokenBytes);
        TERN_ASSERT(get->head_bytes % get->chunk_bytes == 0 && get->head_bytes <= kMaxHeadBytes);
        if (get->have_tag == 0) {
          TERN_ASSERT(get->have_size == 0 && get->have_bitmap.empty());
        } else {
          TERN_ASSERT(get->head_bytes == 0);
          auto chunks = ChunkCount(get->have_size, get->chunk_bytes);
          TERN_ASSERT(chunks.ok() && CheckBitmap(get->have_bitmap, *chunks).ok(),
                      "a GET's bitmap does not fit the version it names");
        }
      } else {
        TERN_ASSERT(IsPrintable(get.status().message()));
      }
      break;
    }
    case 1: {
      auto info = DecodeInfo(in);
      if (info.ok()) {
        TERN_ASSERT(EncodeInfo(*info) == in);
        TERN_ASSERT(info->tag != 0 && info->transfer_id != 0 && (info->flags & ~7) == 0 &&
                    !(info->sending() && info->head()) && (info->hash_known() || info->xxh3 == 0));
      }
      break;
    }
    case 2: {
      if (in.size() < 4) return 0;
      const uint64_t max_bitmap_bytes = DecodeFixedAt(in, 0, 4) % (uint64_t{1} << 24);
      auto want = DecodeWant(in.substr(4), max_bitmap_bytes);
      if (want.ok()) {
        TERN_ASSERT(EncodeWant(want->transfer_id, want->bitmap) == in.substr(4) &&
                    want->bitmap.size() <= max_bitmap_bytes);
      }
      break;
    }
    case 3: {
      for (char type : {kError, kDone}) {
        Status verdict;
        Status st = DecodeStatus(in, type, &verdict);
        if (!st.ok()) {
          TERN_ASSERT(IsPrintable(st.message()));
          continue;
        }
        TERN_ASSERT(TypeOf(in) == type);
        TERN_ASSERT(IsPrintable(verdict.message()), "peer reason reached the status unescaped");
        TERN_ASSERT(verdict.message().size() <= 4 * kMaxReasonBytes + 16);
      }
      break;
    }
    case 4: {
      auto st = ParsePartState(in);
      if (st.ok()) {
        auto chunks = ChunkCount(st->size_bytes, st->chunk_bytes);
        TERN_ASSERT(chunks.ok() && st->bitmap.size() == (*chunks + 7) / 8);
        auto again = ParsePartState(FormatPartState(*st));
        TERN_ASSERT(st->tag != 0 && (st->hash_known || st->xxh3 == 0));
        TERN_ASSERT(again.ok() && again->size_bytes == st->size_bytes && again->tag == st->tag &&
                        again->hash_known == st->hash_known && again->xxh3 == st->xxh3 &&
                        again->chunk_bytes == st->chunk_bytes && again->bitmap == st->bitmap,
                    "a resume state does not survive a format/parse round trip");
      }
      break;
    }
    case 5: {
      if (in.size() < 16) return 0;
      const uint64_t size_bytes = DecodeFixedAt(in, 0, 8), chunk_bytes = DecodeFixedAt(in, 8, 8);
      auto chunks = ChunkCount(size_bytes, chunk_bytes);
      if (chunks.ok()) {
        TERN_ASSERT(*chunks <= kMaxChunks && chunk_bytes >= kMinChunkBytes &&
                    chunk_bytes <= kMaxChunkBytes);
        TERN_ASSERT(*chunks * chunk_bytes >= size_bytes &&
                    (*chunks == 0 || (*chunks - 1) * chunk_bytes < size_bytes));
      }
      break;
    }
    case 6: {
      auto hash = DecodeHash(in);
      if (hash.ok()) {
        TERN_ASSERT(EncodeHash(*hash) == in);
      } else {
        TERN_ASSERT(IsPrintable(hash.status().message()));
      }
      break;
    }
  }
  return 0;
}
