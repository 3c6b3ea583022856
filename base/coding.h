// Little-endian fixed-width integer coding for every wire and file format
// (tcp frames, ucx and verbs wire, xfer messages, patch container). One copy,
// so a format change cannot fix one codec and leave its siblings wrong.
// (leveldb util/coding.h is the model.)
//
// Encode/Decode work on raw pointers the caller has bounds-checked; Put
// appends; Get reads from the front of a string_view and consumes it, or
// returns false (leaving it alone) when too few bytes remain.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace tern {

static_assert(std::endian::native == std::endian::little,
              "tern's formats are little-endian and it is built for little-endian hosts only");

// ---- Raw: p points at enough bytes. ----
inline void EncodeFixed16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline void EncodeFixed32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void EncodeFixed64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
inline uint16_t DecodeFixed16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t DecodeFixed32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t DecodeFixed64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
// The low `bytes` (0..8) bytes of v / of a field that wide.
inline void EncodeFixed(uint8_t* p, uint64_t v, int bytes) { std::memcpy(p, &v, bytes); }
inline uint64_t DecodeFixed(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  std::memcpy(&v, p, bytes);
  return v;
}
inline uint64_t DecodeFixed(const char* p, int bytes) {
  return DecodeFixed(reinterpret_cast<const uint8_t*>(p), bytes);
}

// A field at byte `at` of a message the caller has bounds-checked.
inline uint64_t DecodeFixedAt(std::string_view in, size_t at, int bytes) {
  return DecodeFixed(in.data() + at, bytes);
}

// ---- Append. ----
inline void PutFixed(std::string* out, uint64_t v, int bytes) {
  out->append(reinterpret_cast<const char*>(&v), static_cast<size_t>(bytes));
}
inline void PutFixed(std::vector<uint8_t>* out, uint64_t v, int bytes) {
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(bytes));
  std::memcpy(out->data() + at, &v, static_cast<size_t>(bytes));
}
template <class Out>
void PutFixed16(Out* out, uint16_t v) {
  PutFixed(out, v, 2);
}
template <class Out>
void PutFixed32(Out* out, uint32_t v) {
  PutFixed(out, v, 4);
}
template <class Out>
void PutFixed64(Out* out, uint64_t v) {
  PutFixed(out, v, 8);
}

// ---- Bounded reads that consume the front of *in. ----
inline bool GetFixed(std::string_view* in, int bytes, uint64_t* v) {
  if (in->size() < static_cast<size_t>(bytes)) return false;
  *v = DecodeFixed(in->data(), bytes);
  in->remove_prefix(static_cast<size_t>(bytes));
  return true;
}
inline bool GetFixed16(std::string_view* in, uint16_t* v) {
  uint64_t x;
  if (!GetFixed(in, 2, &x)) return false;
  *v = static_cast<uint16_t>(x);
  return true;
}
inline bool GetFixed32(std::string_view* in, uint32_t* v) {
  uint64_t x;
  if (!GetFixed(in, 4, &x)) return false;
  *v = static_cast<uint32_t>(x);
  return true;
}
inline bool GetFixed64(std::string_view* in, uint64_t* v) { return GetFixed(in, 8, v); }

}  // namespace tern
