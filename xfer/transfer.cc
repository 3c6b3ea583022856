// The transfer layer: windows, retry and resume over any backend.
#include "tern/xfer_chunks.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace tern {

Result<ChunkMap> ChunkMap::Make(uint64_t total_bytes, uint64_t chunk_bytes) {
  TERN_REQUIRE(chunk_bytes >= 1 && chunk_bytes <= kMaxChunkBytes, kOutOfRange, "chunk size ",
               chunk_bytes, " outside [1, ", kMaxChunkBytes, "]");
  ChunkMap map;
  map.total_bytes_ = total_bytes;
  map.chunk_bytes_ = chunk_bytes;
  map.chunks_ = total_bytes / chunk_bytes + (total_bytes % chunk_bytes != 0);
  map.bits_.assign((map.chunks_ + 7) / 8, 0);
  return map;
}

uint64_t ChunkMap::ChunkLength(uint64_t i) const {
  const uint64_t start = i * chunk_bytes_;
  return std::min(chunk_bytes_, total_bytes_ - start);
}

uint64_t ChunkMap::ChunkAt(uint64_t offset) const {
  if (offset % chunk_bytes_ != 0 || offset >= total_bytes_) return chunks_;
  return offset / chunk_bytes_;
}

void ChunkMap::MarkDone(uint64_t i) {
  if (done(i)) return;
  bits_[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
  ++done_chunks_;
  done_bytes_ += ChunkLength(i);
}

Status ChunkMap::SetBits(std::string_view bits) {
  TERN_REQUIRE(bits.size() == bits_.size(), kCorrupt, "chunk bitmap of ", bits.size(),
               " bytes, expected ", bits_.size());
  if (chunks_ % 8 != 0 && !bits.empty()) {
    const uint8_t spare = static_cast<uint8_t>(0xFF << (chunks_ % 8));
    TERN_REQUIRE((static_cast<uint8_t>(bits.back()) & spare) == 0, kCorrupt,
                 "chunk bitmap has bits past the last chunk");
  }
  done_chunks_ = 0;
  done_bytes_ = 0;
  std::fill(bits_.begin(), bits_.end(), 0);
  for (uint64_t i = 0; i < chunks_; ++i) {
    if ((static_cast<uint8_t>(bits[i >> 3]) >> (i & 7)) & 1) MarkDone(i);
  }
  return Status::Ok();
}

namespace {

// State shared between SendChunks and the completions it posts; completions
// may outlive the call (a backend completes them on close), hence shared.
struct SendState {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<uint64_t, Status>> finished;  // chunk index, result
};

}  // namespace

Status SendChunks(Connection& conn, const MemoryRegion& src, uint64_t src_offset,
                  uint64_t transfer_id, ChunkMap& map, const SendOptions& options, Clock& clock) {
  TERN_REQUIRE(src_offset <= src.size_bytes && map.total_bytes() <= src.size_bytes - src_offset,
               kInvalidArgument, "range outside its registered source");
  const uint32_t window = std::max<uint32_t>(1, options.window_chunks);
  auto state = std::make_shared<SendState>();
  std::vector<uint32_t> retries;  // indexed by chunk, allocated on first failure
  uint64_t next = 0;
  uint64_t in_flight = 0;
  Status first_error;
  uint64_t last_progress_us = clock.NowUs();

  auto post = [&](uint64_t i) {
    ChunkSend c;
    c.src = src;
    c.src_offset = src_offset + map.ChunkOffset(i);
    c.length = map.ChunkLength(i);
    c.transfer_id = transfer_id;
    c.dst_offset = map.ChunkOffset(i);
    ++in_flight;
    conn.SendChunk(c, [state, i](Status st) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->finished.emplace_back(i, std::move(st));
      state->cv.notify_all();
    });
  };

  std::deque<uint64_t> resend;
  for (;;) {
    while (first_error.ok() && in_flight < window) {
      if (!resend.empty()) {
        post(resend.front());
        resend.pop_front();
        continue;
      }
      while (next < map.chunks() && map.done(next)) ++next;
      if (next >= map.chunks()) break;
      post(next++);
    }
    if (in_flight == 0) break;

    std::deque<std::pair<uint64_t, Status>> batch;
    {
      std::unique_lock<std::mutex> lock(state->mu);
      state->cv.wait_for(lock, std::chrono::milliseconds(100),
                         [&] { return !state->finished.empty(); });
      batch.swap(state->finished);
    }
    for (auto& [i, st] : batch) {
      --in_flight;
      last_progress_us = clock.NowUs();
      if (st.ok()) {
        map.MarkDone(i);
        continue;
      }
      if (st.code() == Code::kCorrupt && first_error.ok()) {
        if (retries.empty()) retries.assign(map.chunks(), 0);
        if (++retries[i] <= options.max_chunk_retries) {
          resend.push_back(i);
          continue;
        }
      }
      if (first_error.ok()) {
        first_error = st.WithContext("chunk " + std::to_string(i) + " of transfer " +
                                     std::to_string(transfer_id));
      }
    }
    if (!batch.empty() && options.on_progress) options.on_progress(map.done_bytes());
    if (first_error.ok() && clock.NowUs() - last_progress_us > options.stall_timeout_ms * 1000) {
      // Close so the backend fails what is in flight; then drain below.
      first_error = TERN_ERROR(kTimeout, "no chunk acknowledged for ", options.stall_timeout_ms,
                               " ms");
      conn.Close();
    }
  }
  if (!first_error.ok()) return first_error;
  TERN_REQUIRE(map.complete(), kInternal, "send loop ended with chunks missing");
  return Status::Ok();
}

}  // namespace tern
