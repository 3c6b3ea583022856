// A strict, pull-style JSON (RFC 8259) reader for untrusted headers.
//
// Pull-style so callers consume exactly the schema they expect and memory
// stays proportional to what they keep, not to the input (a DOM of a 100 MB
// header of `[0,0,...]` would take gigabytes). Nesting depth is bounded;
// strings must be valid UTF-8 (no overlong forms, no surrogates); numbers
// follow the JSON grammar. Every error is kCorrupt and names the byte offset.
// Not thread-safe (one reader per thread).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tern/status.h"

namespace tern::json {

class Reader {
 public:
  explicit Reader(std::string_view text, int depth_max = 32) : text_(text), depth_max_(depth_max) {}

  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject, kEnd };
  // Kind of the next value, without consuming it (kEnd at end of input).
  Kind Peek();

  Status BeginObject();
  // Within an object: true and the key (the reader then sits on its value),
  // or false after consuming the closing brace.
  Result<bool> NextKey(std::string* key);
  Status BeginArray();
  // Within an array: true when an element follows, false after the ']'.
  Result<bool> NextItem();

  Result<std::string> ReadString();
  // A non-negative integer without fraction or exponent that fits in 64 bits.
  Result<uint64_t> ReadU64();
  // Consumes any value, validating it.
  Status SkipValue();
  // Only whitespace may remain.
  Status Finish();

  size_t offset() const { return pos_; }

 private:
  Status Error(std::string_view what) const;
  void SkipSpace();
  Status Expect(char c);
  Status Push(bool is_object);
  Status ParseString(std::string* out);
  Status ParseNumber(std::string_view* literal);
  Status ParseLiteral(std::string_view word);

  std::string_view text_;
  size_t pos_ = 0;
  int depth_max_;
  // Per open container: whether its first member/element is still to come.
  std::vector<bool> first_;
};

// Appends `s` as a JSON string the way serde_json writes it (the reference
// safetensors writer): escapes '"', '\\' and control characters, nothing else.
void AppendQuoted(std::string_view s, std::string* out);
// Appends `s` as Python's json.dumps does by default (ensure_ascii): also
// escapes every non-ASCII character as \uXXXX (surrogate pairs above U+FFFF).
// `s` must be valid UTF-8.
void AppendQuotedAscii(std::string_view s, std::string* out);
// True when `s` is valid UTF-8 (strict: no overlong forms or surrogates).
bool ValidUtf8(std::string_view s);

}  // namespace tern::json
