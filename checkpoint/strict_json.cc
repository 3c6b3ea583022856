#include "checkpoint/strict_json.h"

#include <new>

namespace tern::checkpoint::json {
namespace {

constexpr size_t kQuotedBytesMax = 200;
constexpr size_t kDetailBytesMax = 200;

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// nlohmann's what() is "[json.exception.parse_error.101] parse error at line
// 1, column 5: syntax error while parsing value - ...": keep the part after
// the position, which ParseObject's message gives as a byte offset instead.
std::string Detail(const char* what) {
  std::string_view s(what);
  if (const size_t at = s.find(": "); at != std::string_view::npos) s.remove_prefix(at + 2);
  std::string out(s.substr(0, kDetailBytesMax));
  if (s.size() > kDetailBytesMax) out += "...";
  return out;
}

}  // namespace

std::string_view EventName(Event e) {
  switch (e) {
    case Event::kNull: return "null";
    case Event::kBool: return "a boolean";
    case Event::kUnsigned: return "a non-negative integer";
    case Event::kNegative: return "a negative integer";
    case Event::kFloat: return "a number";
    case Event::kString: return "a string";
    case Event::kBeginObject: return "an object";
    case Event::kKey: return "a key";
    case Event::kEndObject: return "'}'";
    case Event::kBeginArray: return "an array";
    case Event::kEndArray: return "']'";
  }
  return "?";
}

bool StrictSax::number_float(number_float_t, const string_t& s) {
  // The raw text travels for the message; nothing reads the double.
  string_t copy = s;
  return Dispatch(Event::kFloat, {0, &copy});
}

bool StrictSax::binary(binary_t&) {
  return Fail(TERN_ERROR(kCorrupt, "binary value in JSON text"));
}

bool StrictSax::parse_error(std::size_t position, const std::string&,
                            const nlohmann::detail::exception& ex) {
  if (done())
    return Fail(TERN_ERROR(kCorrupt, "JSON at byte ", position > 0 ? position - 1 : 0,
                           ": trailing bytes after the JSON value"));
  return Fail(TERN_ERROR(kCorrupt, "JSON at byte ", position > 0 ? position - 1 : 0, ": ",
                         Detail(ex.what())));
}

bool StrictSax::Fail(Status s) {
  if (status_.ok()) status_ = std::move(s);
  return false;
}

void StrictSax::SkipValue(Event e) {
  if (e == Event::kBeginObject || e == Event::kBeginArray) skip_depth_ = 1;
}

Status StrictSax::NotU64(Event e, Token t) const {
  if (e == Event::kFloat && AllDigits(*t.text))
    return TERN_ERROR(kCorrupt, "integer ", t.text->substr(0, 40), " does not fit in 64 bits");
  if (e == Event::kFloat)
    return TERN_ERROR(kCorrupt, "expected a non-negative integer, got ", t.text->substr(0, 40));
  return TERN_ERROR(kCorrupt, "expected a non-negative integer, got ", EventName(e));
}

bool StrictSax::Dispatch(Event e, Token t) {
  if (!status_.ok()) return false;
  started_ = true;
  const bool begins = e == Event::kBeginObject || e == Event::kBeginArray;
  const bool ends = e == Event::kEndObject || e == Event::kEndArray;
  if (begins && ++depth_ > depth_max_)
    return Fail(TERN_ERROR(kCorrupt, "JSON nested deeper than ", depth_max_));
  if (ends) --depth_;
  if (skip_depth_ > 0) {
    if (begins) ++skip_depth_;
    if (ends) --skip_depth_;
    return true;
  }
  return On(e, t);
}

Status ParseObject(std::string_view text, std::string_view what, StrictSax* sax) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  TERN_REQUIRE(first != std::string_view::npos && text[first] == '{', kCorrupt, what,
               " is not a JSON object");
  // nlohmann's lexer takes a NUL byte for the end of the input (C strings),
  // so it would accept "{}\0garbage": the parser sees only the text before
  // the first NUL, which is never valid in JSON text.
  const size_t nul = text.find('\0');
  const std::string_view json = text.substr(0, nul);
  try {
    const bool ok = nlohmann::json::sax_parse(json.data(), json.data() + json.size(), sax,
                                              nlohmann::json::input_format_t::json,
                                              /*strict=*/true, /*ignore_comments=*/false);
    if (nul != std::string_view::npos) {
      TERN_REQUIRE(!ok, kCorrupt, "JSON at byte ", nul, ": trailing bytes after the JSON value");
      return TERN_ERROR(kCorrupt, "JSON at byte ", nul, ": NUL byte");
    }
    TERN_RETURN_IF_ERROR(sax->status());
    TERN_REQUIRE(ok, kCorrupt, what, ": JSON parser stopped without saying why");
  } catch (const std::bad_alloc&) {
    return TERN_ERROR(kResourceExhausted, what, ": out of memory parsing ", text.size(),
                      " bytes of JSON");
  } catch (const std::exception& e) {
    // nlohmann reports through parse_error(); this is the safety net for
    // anything it throws instead.
    return TERN_ERROR(kCorrupt, what, ": ", Detail(e.what()));
  }
  return Status::Ok();
}

Result<bool> StringMapReader::Next(Event e, Token t, const Entry& entry) {
  switch (state_) {
    case State::kBegin:
      TERN_REQUIRE(e == Event::kBeginObject, kCorrupt, what_, " is not an object of strings");
      state_ = State::kKey;
      return false;
    case State::kKey:
      if (e == Event::kEndObject) {
        state_ = State::kDone;
        return true;
      }
      key_ = std::move(*t.text);  // inside an object, anything but '}' is a key
      state_ = State::kValue;
      return false;
    case State::kValue:
      TERN_REQUIRE(e == Event::kString, kCorrupt, what_, " entry ", Quoted(key_),
                   " is not a string");
      state_ = State::kKey;
      TERN_RETURN_IF_ERROR(entry(std::move(key_), std::move(*t.text)));
      return false;
    case State::kDone:
      break;
  }
  TERN_ASSERT(false, "StringMapReader fed past the end of its object");
  return true;
}

std::string Quoted(std::string_view s) {
  return nlohmann::json(std::string(s.substr(0, kQuotedBytesMax)))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tern::checkpoint::json
