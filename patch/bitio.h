// LSB-first bit streams for the segment codec (spec "Bit streams").
// Writer: 64-bit accumulator, flushes 32 bits at a time. Reader: unaligned
// 64-bit loads; reads past the end see zero bits and are caught by the
// caller's bounds checks (Overrun / Finish).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tern::patch {

class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>* out) : out_(out) {}

  // n <= 64 bits of v (higher bits of v ignored).
  void Put(uint64_t v, int n) {
    if (n > 32) {
      Put32(v & 0xffffffffu, 32);
      Put32(v >> 32, n - 32);
    } else {
      Put32(v, n);
    }
  }
  // q zero bits then a one bit.
  void PutUnary(uint64_t q) {
    while (q >= 32) {
      Put32(0, 32);
      q -= 32;
    }
    Put32(uint64_t{1} << q, static_cast<int>(q) + 1);
  }
  // Pads with zero bits to a byte boundary and flushes.
  void Finish() {
    while (nacc_ > 0) {
      out_->push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      nacc_ = nacc_ > 8 ? nacc_ - 8 : 0;
    }
  }

 private:
  void Put32(uint64_t v, int n) {
    if (n == 0) return;
    acc_ |= (v & ((uint64_t{1} << n) - 1)) << nacc_;
    nacc_ += n;
    if (nacc_ >= 32) {
      const uint32_t low = static_cast<uint32_t>(acc_);
      const size_t at = out_->size();
      out_->resize(at + 4);
      std::memcpy(out_->data() + at, &low, 4);
      acc_ >>= 32;
      nacc_ -= 32;
    }
  }
  std::vector<uint8_t>* out_;
  uint64_t acc_ = 0;
  int nacc_ = 0;
};

class BitReader {
 public:
  BitReader(const uint8_t* data, uint64_t bytes) : data_(data), bytes_(bytes), bits_(bytes * 8) {}

  // Next n <= 56 bits without consuming them.
  [[gnu::always_inline]] uint64_t Peek(int n) const {
    const uint64_t byte = pos_ >> 3;
    uint64_t w = 0;
    if (byte + 8 <= bytes_) {
      std::memcpy(&w, data_ + byte, 8);
    } else if (byte < bytes_) {
      std::memcpy(&w, data_ + byte, bytes_ - byte);
    }
    w >>= (pos_ & 7);
    return n == 0 ? 0 : (w & (~uint64_t{0} >> (64 - n)));
  }
  void Skip(int n) { pos_ += static_cast<uint64_t>(n); }
  void SkipBits(uint64_t n) { pos_ += n; }
  // Forced inline (as ReadUnary): the decode loops call these once or twice
  // per change, and out-of-line calls cost as much as the work.
  [[gnu::always_inline]] uint64_t Read(int n) {  // n <= 64
    if (n > 56) [[unlikely]] return ReadLong(n);
    const uint64_t v = Peek(n);
    pos_ += static_cast<uint64_t>(n);
    return v;
  }
  // Counts zero bits up to the next one bit (consumed). Returns false when
  // the stream ends first or the count exceeds `max_q` (bounded work on
  // hostile input: at most max_q/56 + 2 loads).
  [[gnu::always_inline]] bool ReadUnary(uint64_t max_q, uint64_t* q) {
    uint64_t n = 0;
    for (;;) {
      if (pos_ >= bits_) return false;
      const uint64_t w = Peek(56);
      if (w != 0) {
        const int tz = std::countr_zero(w);
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
  // The fast path of the decode loops: while FastReads() > 0, PeekFast()
  // may be called that many times, each followed by Skip(n <= 56), with no
  // bounds check. It is one unaligned load that stays inside the stream
  // (so no zero fill is needed), and a read of at most 56 bits from it can
  // never pass the end, so Overrun() stays false. Callers fall back to the
  // checked Peek/Read/ReadUnary near the end and for anything longer.
  uint64_t FastReads() const {
    const uint64_t byte = pos_ >> 3;
    if (byte + 8 > bytes_) return 0;
    // A load at byte b needs b + 8 <= bytes_, i.e. pos_ <= last; each read
    // advances pos_ by at most 56.
    const uint64_t last = (bytes_ - 8) * 8 + 7;
    return (last - pos_) / 56 + 1;
  }
  // Next 64 bits from pos_, of which the low 57 are stream bits. Only valid
  // while FastReads() says so.
  [[gnu::always_inline]] uint64_t PeekFast() const {
    uint64_t w;
    std::memcpy(&w, data_ + (pos_ >> 3), 8);
    return w >> (pos_ & 7);
  }
  // PeekFast at bit `at` (>= the position, with FastReads() covering it),
  // for a loop that keeps its position in a register between SkipBits.
  [[gnu::always_inline]] uint64_t PeekFastAt(uint64_t at) const {
    uint64_t w;
    std::memcpy(&w, data_ + (at >> 3), 8);
    return w >> (at & 7);
  }
  bool Overrun() const { return pos_ > bits_; }
  // True when every byte was used and the padding bits are zero: the stream
  // is exactly what an encoder would have written.
  bool FinishedCleanly() const {
    if (pos_ > bits_ || (pos_ + 7) / 8 != bytes_) return false;
    if ((pos_ & 7) == 0) return true;
    return (data_[bytes_ - 1] >> (pos_ & 7)) == 0;
  }
  uint64_t position_bits() const { return pos_; }

 private:
  [[gnu::noinline]] uint64_t ReadLong(int n) {
    const uint64_t lo = Read(32);
    return lo | (Read(n - 32) << 32);
  }
  const uint8_t* data_;
  uint64_t bytes_;
  uint64_t bits_;
  uint64_t pos_ = 0;
};

}  // namespace tern::patch
