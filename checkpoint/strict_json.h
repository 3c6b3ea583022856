// Strict, streaming JSON for the untrusted JSON of checkpoints (safetensors
// headers, model.safetensors.index.json), on nlohmann-json's SAX parser.
//
// Why nlohmann, and why SAX rather than its DOM (docs/checkpoint.md, "JSON"):
// nlohmann is Debian's well-kept JSON library and strict RFC 8259 (UTF-8
// validated, no comments, no trailing commas, no NaN, lone surrogates
// refused); its SAX parser is iterative, so no input can overflow the stack,
// and the consumer keeps only what its schema asks for, so memory follows
// what is kept, not the input (a DOM of a 100 MB header of `[0,0,...]` would
// take gigabytes). simdjson parses faster, but a 10k-tensor header parses in
// milliseconds here (docs/benchmarks-journal.md, "Safetensors header parse"), far
// below the cost of mapping the files, and simdjson needs padded input.
//
// What this layer adds to nlohmann: the input must be exactly one object
// (nlohmann silently skips a UTF-8 byte order mark; we do not), nesting is
// bounded, every event the consumer does not expect is an error, and every
// exception is caught: each error is one kCorrupt line (or the consumer's own
// Status). Duplicate keys are the consumer's to reject: it sees every key
// (nlohmann's DOM would keep the last one silently).
//
// Not thread-safe: one consumer per parse.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tern/status.h"

namespace tern::checkpoint::json {

// One SAX event, as a consumer of StrictSax sees it.
enum class Event : uint8_t {
  kNull,
  kBool,
  kUnsigned,  // a non-negative integer that fits in 64 bits: Token::u64
  kNegative,  // a negative integer
  kFloat,     // a fraction, an exponent, or an integer beyond 64 bits: Token::text
  kString,    // Token::text
  kBeginObject,
  kKey,  // Token::text
  kEndObject,
  kBeginArray,
  kEndArray,
};

struct Token {
  uint64_t u64 = 0;
  std::string* text = nullptr;  // the parser's buffer: may be moved from
};

// "a string", "an array", ... for error messages.
std::string_view EventName(Event e);

// Consumers implement On(); StrictSax turns nlohmann's callbacks into it,
// bounds the nesting and records the first error.
class StrictSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit StrictSax(int depth_max) : depth_max_(depth_max) {}

  const Status& status() const { return status_; }
  // True once the top-level value is complete.
  bool done() const { return depth_ == 0 && started_; }

  // nlohmann's callbacks (public because nlohmann calls them).
  bool null() final { return Dispatch(Event::kNull, {}); }
  bool boolean(bool) final { return Dispatch(Event::kBool, {}); }
  bool number_integer(number_integer_t) final { return Dispatch(Event::kNegative, {}); }
  bool number_unsigned(number_unsigned_t v) final { return Dispatch(Event::kUnsigned, {v, nullptr}); }
  bool number_float(number_float_t, const string_t& s) final;
  bool string(string_t& s) final { return Dispatch(Event::kString, {0, &s}); }
  bool binary(binary_t&) final;  // never produced from JSON text
  bool start_object(std::size_t) final { return Dispatch(Event::kBeginObject, {}); }
  bool key(string_t& s) final { return Dispatch(Event::kKey, {0, &s}); }
  bool end_object() final { return Dispatch(Event::kEndObject, {}); }
  bool start_array(std::size_t) final { return Dispatch(Event::kBeginArray, {}); }
  bool end_array() final { return Dispatch(Event::kEndArray, {}); }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) final;

 protected:
  // Return false to stop the parse (after Fail()).
  virtual bool On(Event e, Token t) = 0;
  // Records the first error; returns false so callers can `return Fail(...)`.
  bool Fail(Status s);
  // Ignores the value that `e` begins (a scalar, or a whole object or array).
  void SkipValue(Event e);
  // The standard complaint about a number where a u64 was expected, or about
  // any other event there.
  Status NotU64(Event e, Token t) const;

 private:
  bool Dispatch(Event e, Token t);

  const int depth_max_;
  int depth_ = 0;
  int skip_depth_ = 0;  // > 0 while inside a skipped object or array
  bool started_ = false;
  Status status_;
};

// A {string: string, ...} value inside a consumer's schema (safetensors'
// __metadata__, an index's weight_map), read event by event: the consumer
// hands it every event from the value's first one until Next returns true,
// after the closing '}'. Each pair goes to `entry` (which may refuse it), so
// duplicate keys are the consumer's to reject. One value per reader.
class StringMapReader {
 public:
  using Entry = std::function<Status(std::string key, std::string value)>;
  // `what` names the value in errors: "<what> is not an object of strings",
  // "<what> entry <key> is not a string".
  explicit StringMapReader(std::string what) : what_(std::move(what)) {}

  // kCorrupt for a value that is not an object of strings, or entry's error.
  Result<bool> Next(Event e, Token t, const Entry& entry);

 private:
  enum class State : uint8_t { kBegin, kKey, kValue, kDone };
  const std::string what_;
  State state_ = State::kBegin;
  std::string key_;
};

// Parses `text` into `sax`. `text` must be one JSON object, then only
// whitespace (kCorrupt: "<what> is not a JSON object" otherwise). Returns the
// consumer's first error, or kCorrupt "JSON at byte N: ..." for malformed
// JSON. Never throws (std::bad_alloc becomes kResourceExhausted).
Status ParseObject(std::string_view text, std::string_view what, StrictSax* sax);

// `s` (its first 200 bytes) as a JSON string, for error messages: control
// characters escaped, invalid UTF-8 replaced.
std::string Quoted(std::string_view s);

}  // namespace tern::checkpoint::json
