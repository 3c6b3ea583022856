// The LSB-first bit streams of a segment record (docs/format/patch.md §4), as
// TERN_HD code (format/hd.h): patch/'s codec and gpu/'s kernels read and
// write every stream through these two classes.
//
// BitReader: reads past the end see zero bits and are caught by the caller's
// bounds checks (Overrun, FinishedCleanly), so every decoder rejects the same
// inputs. The checked reads (Peek, Read, ReadUnary) serve from a 64-bit
// window loaded at a byte boundary and reloaded only when a read needs bits
// past it: on a GPU thread the loads, not the shifts, are the cost. Skip is
// a plain add, so the CPU's fast loops, which load for themselves
// (FastReads, PeekFast, PeekFastAt), pay nothing for the window.
//
// BitWriter: a 64-bit accumulator flushed 32 bits at a time into a Sink
// (forced inline: the encoders put two codes per change),
// which the caller picks (patch/bitio.h: a growing std::vector; ByteSink
// below: a bounded device buffer). A Sink has Size(), Push(uint8_t) and
// Append32(uint32_t) (four bytes, little-endian).
#pragma once

#include <cstdint>
#include <cstring>

#include "format/hd.h"

namespace tern::format {

class BitReader {
 public:
  TERN_HD BitReader() {}
  TERN_HD BitReader(const uint8_t* data, uint64_t bytes)
      : data_(data), bytes_(bytes), bits_(bytes * 8) {}

  // Next n <= 56 bits without consuming them.
  TERN_HD_ALWAYS_INLINE uint64_t Peek(int n) {
    if (n == 0) return 0;
    if (pos_ + static_cast<uint64_t>(n) > window_end_) Load();
    return (window_ >> (pos_ - window_at_)) & (~uint64_t{0} >> (64 - n));
  }
  TERN_HD void Skip(int n) { pos_ += static_cast<uint64_t>(n); }
  TERN_HD void SkipBits(uint64_t n) { pos_ += n; }
  // Forced inline (as ReadUnary): the decode loops call these once or twice
  // per change, and out-of-line calls cost as much as the work.
  TERN_HD_ALWAYS_INLINE uint64_t Read(int n) {  // n <= 64
    if (n > 56) return ReadLong(n);
    const uint64_t v = Peek(n);
    pos_ += static_cast<uint64_t>(n);
    return v;
  }
  // Counts zero bits up to the next one bit (consumed). Returns false when
  // the stream ends first or the count exceeds `max_q` (bounded work on
  // hostile input: at most max_q/56 + 2 loads).
  TERN_HD_ALWAYS_INLINE bool ReadUnary(uint64_t max_q, uint64_t* q) {
    uint64_t n = 0;
    for (;;) {
      if (pos_ >= bits_) return false;
      const uint64_t w = Peek(56);
      if (w != 0) {
        const int tz = hd::Ctz64(w);
        n += static_cast<uint64_t>(tz);
        pos_ += static_cast<uint64_t>(tz) + 1;
        if (n > max_q || pos_ > bits_) return false;
        *q = n;
        return true;
      }
      n += 56;
      pos_ += 56;
      if (n > max_q) return false;
    }
  }
  // The CPU decode loops' fast path: while FastReads() > 0, PeekFast() may
  // be called that many times, each followed by Skip(n <= 56), with no
  // bounds check. It is one unaligned load that stays inside the stream (so
  // no zero fill is needed), and a read of at most 56 bits from it can never
  // pass the end, so Overrun() stays false. Callers fall back to the checked
  // Peek/Read/ReadUnary near the end and for anything longer.
  TERN_HD uint64_t FastReads() const {
    const uint64_t byte = pos_ >> 3;
    if (byte + 8 > bytes_) return 0;
    // A load at byte b needs b + 8 <= bytes_, i.e. pos_ <= last; each read
    // advances pos_ by at most 56.
    const uint64_t last = (bytes_ - 8) * 8 + 7;
    return (last - pos_) / 56 + 1;
  }
  // Next 64 bits from the position, of which the low 57 are stream bits.
  // Only valid while FastReads() says so.
  TERN_HD_ALWAYS_INLINE uint64_t PeekFast() const { return PeekFastAt(pos_); }
  // PeekFast at bit `at` (>= the position, with FastReads() covering it),
  // for a loop that keeps its position in a register between SkipBits.
  TERN_HD_ALWAYS_INLINE uint64_t PeekFastAt(uint64_t at) const {
    uint64_t w;
    memcpy(&w, data_ + (at >> 3), 8);
    return w >> (at & 7);
  }
  TERN_HD bool Overrun() const { return pos_ > bits_; }
  // True when every byte was used and the padding bits are zero: the stream
  // is exactly what an encoder would have written.
  TERN_HD bool FinishedCleanly() const {
    if (pos_ > bits_ || (pos_ + 7) / 8 != bytes_) return false;
    if ((pos_ & 7) == 0) return true;
    return (data_[bytes_ - 1] >> (pos_ & 7)) == 0;
  }
  TERN_HD uint64_t position_bits() const { return pos_; }

 private:
  // Two reads, without calling Read (no recursion in a forced inline).
  TERN_HD uint64_t ReadLong(int n) {
    const uint64_t lo = Peek(32);
    pos_ += 32;
    const uint64_t hi = Peek(n - 32);
    pos_ += static_cast<uint64_t>(n - 32);
    return lo | (hi << 32);
  }
  // The 8 bytes from the position's byte, zero past the end.
  TERN_HD void Load() {
    const uint64_t byte = pos_ >> 3;
    uint64_t w = 0;
    if (byte + 8 <= bytes_) {
      memcpy(&w, data_ + byte, 8);
    } else {
      for (uint64_t b = 0; byte + b < bytes_; ++b)
        w |= static_cast<uint64_t>(data_[byte + b]) << (8 * b);
    }
    window_ = w;
    window_at_ = byte * 8;
    window_end_ = window_at_ + 64;
  }
  const uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t bits_ = 0;
  uint64_t pos_ = 0;
  // Stream bits [window_at_, window_end_ = window_at_ + 64); empty until
  // the first Peek loads it. Positions only grow, so pos_ >= window_at_.
  uint64_t window_ = 0;
  uint64_t window_at_ = 0, window_end_ = 0;
};

template <class Sink>
class BitWriter {
 public:
  TERN_HD explicit BitWriter(Sink* out) : out_(out) {}

  // n <= 64 bits of v (higher bits of v ignored).
  TERN_HD_ALWAYS_INLINE void Put(uint64_t v, int n) {
    if (n > 32) {
      Put32(v & 0xffffffffu, 32);
      Put32(v >> 32, n - 32);
    } else {
      Put32(v, n);
    }
  }
  // q zero bits then a one bit.
  TERN_HD_ALWAYS_INLINE void PutUnary(uint64_t q) {
    while (q >= 32) {
      Put32(0, 32);
      q -= 32;
    }
    Put32(uint64_t{1} << q, static_cast<int>(q) + 1);
  }
  // Pads with zero bits to a byte boundary and flushes.
  TERN_HD void Finish() {
    while (nacc_ > 0) {
      out_->Push(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      nacc_ = nacc_ > 8 ? nacc_ - 8 : 0;
    }
  }

 private:
  TERN_HD_ALWAYS_INLINE void Put32(uint64_t v, int n) {
    if (n == 0) return;
    acc_ |= (v & ((uint64_t{1} << n) - 1)) << nacc_;
    nacc_ += n;
    if (nacc_ >= 32) {
      out_->Append32(static_cast<uint32_t>(acc_));
      acc_ >>= 32;
      nacc_ -= 32;
    }
  }
  Sink* out_;
  uint64_t acc_ = 0;
  int nacc_ = 0;
};

// Bounded output into a caller's buffer; a write past the capacity is
// dropped and flagged (the caller sized the buffer for the worst case, so
// this is a bug check, not a control path).
struct ByteSink {
  uint8_t* data;
  uint64_t capacity;
  uint64_t size = 0;
  bool overflow = false;
  TERN_HD uint64_t Size() const { return size; }
  TERN_HD void Push(uint8_t b) {
    if (size < capacity) {
      data[size] = b;
    } else {
      overflow = true;
    }
    ++size;
  }
  TERN_HD void Append32(uint32_t v) {
    for (int i = 0; i < 4; ++i) Push(static_cast<uint8_t>(v >> (8 * i)));
  }
};

}  // namespace tern::format
