#include "checkpoint/json_reader.h"

namespace tern::json {
namespace {

// Length of the strict UTF-8 sequence at p (n bytes available), 0 if invalid.
size_t Utf8SequenceBytes(const unsigned char* p, size_t n) {
  const unsigned c = p[0];
  if (c < 0x80) return 1;
  auto cont = [&](size_t i, unsigned lo, unsigned hi) {
    return i < n && p[i] >= lo && p[i] <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF) return cont(1, 0x80, 0xBF) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80;
    const unsigned hi = c == 0xED ? 0x9F : 0xBF;  // 0xED A0..BF would be a surrogate
    return cont(1, lo, hi) && cont(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendU16Escape(uint32_t unit, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->append("\\u");
  for (int shift = 12; shift >= 0; shift -= 4) out->push_back(kHex[(unit >> shift) & 0xF]);
}

// Shared by both quoting styles: the escapes serde_json and Python agree on.
bool AppendShortEscape(unsigned char c, std::string* out) {
  switch (c) {
    case '"': out->append("\\\""); return true;
    case '\\': out->append("\\\\"); return true;
    case '\b': out->append("\\b"); return true;
    case '\f': out->append("\\f"); return true;
    case '\n': out->append("\\n"); return true;
    case '\r': out->append("\\r"); return true;
    case '\t': out->append("\\t"); return true;
    default: return false;
  }
}

}  // namespace

bool ValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = Utf8SequenceBytes(p + i, s.size() - i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void AppendQuoted(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (AppendShortEscape(c, out)) continue;
    if (c < 0x20) {
      AppendU16Escape(c, out);
    } else {
      out->push_back(ch);
    }
  }
  out->push_back('"');
}

void AppendQuotedAscii(std::string_view s, std::string* out) {
  out->push_back('"');
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (!AppendShortEscape(c, out)) {
        if (c < 0x20 || c == 0x7F) AppendU16Escape(c, out);
        else out->push_back(static_cast<char>(c));
      }
      ++i;
      continue;
    }
    size_t n = Utf8SequenceBytes(p + i, s.size() - i);
    TERN_ASSERT(n > 0, "AppendQuotedAscii needs valid UTF-8");
    uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      AppendU16Escape(0xD800 | (cp >> 10), out);
      AppendU16Escape(0xDC00 | (cp & 0x3FF), out);
    } else {
      AppendU16Escape(cp, out);
    }
    i += n;
  }
  out->push_back('"');
}

Status Reader::Error(std::string_view what) const {
  return TERN_ERROR(kCorrupt, "JSON at byte ", pos_, ": ", what);
}

void Reader::SkipSpace() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
    ++pos_;
  }
}

Status Reader::Expect(char c) {
  SkipSpace();
  if (pos_ >= text_.size()) return Error(std::string("unexpected end, expected '") + c + "'");
  if (text_[pos_] != c) return Error(std::string("expected '") + c + "'");
  ++pos_;
  return Status::Ok();
}

Reader::Kind Reader::Peek() {
  SkipSpace();
  if (pos_ >= text_.size()) return Kind::kEnd;
  switch (text_[pos_]) {
    case '{': return Kind::kObject;
    case '[': return Kind::kArray;
    case '"': return Kind::kString;
    case 't':
    case 'f': return Kind::kBool;
    case 'n': return Kind::kNull;
    default: return Kind::kNumber;  // anything else fails in ParseNumber
  }
}

Status Reader::Push(bool is_object) {
  if (first_.size() >= static_cast<size_t>(depth_max_))
    return Error("nesting deeper than " + std::to_string(depth_max_));
  TERN_RETURN_IF_ERROR(Expect(is_object ? '{' : '['));
  first_.push_back(true);
  return Status::Ok();
}

Status Reader::BeginObject() { return Push(true); }
Status Reader::BeginArray() { return Push(false); }

Result<bool> Reader::NextKey(std::string* key) {
  TERN_ASSERT(!first_.empty(), "NextKey outside an object");
  SkipSpace();
  if (pos_ >= text_.size()) return Error("unexpected end inside an object");
  if (text_[pos_] == '}') {
    ++pos_;
    first_.pop_back();
    return false;
  }
  if (!first_.back()) TERN_RETURN_IF_ERROR(Expect(','));
  first_.back() = false;
  SkipSpace();
  if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected an object key");
  key->clear();
  TERN_RETURN_IF_ERROR(ParseString(key));
  TERN_RETURN_IF_ERROR(Expect(':'));
  return true;
}

Result<bool> Reader::NextItem() {
  TERN_ASSERT(!first_.empty(), "NextItem outside an array");
  SkipSpace();
  if (pos_ >= text_.size()) return Error("unexpected end inside an array");
  if (text_[pos_] == ']') {
    ++pos_;
    first_.pop_back();
    return false;
  }
  if (!first_.back()) TERN_RETURN_IF_ERROR(Expect(','));
  first_.back() = false;
  return true;
}

Status Reader::ParseString(std::string* out) {
  ++pos_;  // opening quote, checked by the caller
  const auto* p = reinterpret_cast<const unsigned char*>(text_.data());
  while (true) {
    if (pos_ >= text_.size()) return Error("unterminated string");
    const unsigned char c = p[pos_];
    if (c == '"') {
      ++pos_;
      return Status::Ok();
    }
    if (c < 0x20) return Error("control character in string");
    if (c >= 0x80) {
      const size_t n = Utf8SequenceBytes(p + pos_, text_.size() - pos_);
      if (n == 0) return Error("invalid UTF-8 in string");
      out->append(text_.substr(pos_, n));
      pos_ += n;
      continue;
    }
    if (c != '\\') {
      // Plain ASCII runs are the common case: append them in one go.
      size_t end = pos_ + 1;
      while (end < text_.size() && p[end] >= 0x20 && p[end] < 0x80 && p[end] != '"' &&
             p[end] != '\\')
        ++end;
      out->append(text_.substr(pos_, end - pos_));
      pos_ = end;
      continue;
    }
    if (pos_ + 1 >= text_.size()) return Error("unterminated escape");
    const char e = text_[pos_ + 1];
    pos_ += 2;
    switch (e) {
      case '"': out->push_back('"'); continue;
      case '\\': out->push_back('\\'); continue;
      case '/': out->push_back('/'); continue;
      case 'b': out->push_back('\b'); continue;
      case 'f': out->push_back('\f'); continue;
      case 'n': out->push_back('\n'); continue;
      case 'r': out->push_back('\r'); continue;
      case 't': out->push_back('\t'); continue;
      case 'u': break;
      default: return Error("invalid escape");
    }
    auto read_unit = [&](uint32_t* unit) -> Status {
      if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
      uint32_t v = 0;
      for (int k = 0; k < 4; ++k) {
        const int d = HexDigit(text_[pos_ + k]);
        if (d < 0) return Error("bad hex digit in \\u escape");
        v = (v << 4) | static_cast<uint32_t>(d);
      }
      pos_ += 4;
      *unit = v;
      return Status::Ok();
    };
    uint32_t cp = 0;
    TERN_RETURN_IF_ERROR(read_unit(&cp));
    if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("lone low surrogate");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (text_.size() - pos_ < 2 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
        return Error("lone high surrogate");
      pos_ += 2;
      uint32_t low = 0;
      TERN_RETURN_IF_ERROR(read_unit(&low));
      if (low < 0xDC00 || low > 0xDFFF) return Error("high surrogate without low surrogate");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    AppendUtf8(cp, out);
  }
}

Status Reader::ParseNumber(std::string_view* literal) {
  const size_t begin = pos_;
  auto digit = [&] { return pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9'; };
  if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
  if (!digit()) return Error("expected a value");
  if (text_[pos_] == '0') {
    ++pos_;
  } else {
    while (digit()) ++pos_;
  }
  if (pos_ < text_.size() && text_[pos_] == '.') {
    ++pos_;
    if (!digit()) return Error("expected digits after '.'");
    while (digit()) ++pos_;
  }
  if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    if (!digit()) return Error("expected exponent digits");
    while (digit()) ++pos_;
  }
  *literal = text_.substr(begin, pos_ - begin);
  return Status::Ok();
}

Status Reader::ParseLiteral(std::string_view word) {
  if (text_.substr(pos_, word.size()) != word) return Error("expected a value");
  pos_ += word.size();
  return Status::Ok();
}

Result<std::string> Reader::ReadString() {
  if (Peek() != Kind::kString) return Error("expected a string");
  std::string out;
  TERN_RETURN_IF_ERROR(ParseString(&out));
  return out;
}

Result<uint64_t> Reader::ReadU64() {
  if (Peek() != Kind::kNumber) return Error("expected a non-negative integer");
  const size_t begin = pos_;
  std::string_view literal;
  TERN_RETURN_IF_ERROR(ParseNumber(&literal));
  uint64_t v = 0;
  for (char c : literal) {
    if (c < '0' || c > '9') {
      pos_ = begin;
      return Error("expected a non-negative integer, got " + std::string(literal.substr(0, 40)));
    }
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) {
      pos_ = begin;
      return Error("integer does not fit in 64 bits");
    }
    v = v * 10 + d;
  }
  return v;
}

Status Reader::SkipValue() {
  switch (Peek()) {
    case Kind::kEnd: return Error("unexpected end, expected a value");
    case Kind::kNull: return ParseLiteral("null");
    case Kind::kBool: return ParseLiteral(text_[pos_] == 't' ? "true" : "false");
    case Kind::kString: {
      std::string ignored;
      return ParseString(&ignored);
    }
    case Kind::kNumber: {
      std::string_view ignored;
      return ParseNumber(&ignored);
    }
    case Kind::kArray: {
      TERN_RETURN_IF_ERROR(BeginArray());
      while (true) {
        TERN_ASSIGN_OR_RETURN(bool more, NextItem());
        if (!more) return Status::Ok();
        TERN_RETURN_IF_ERROR(SkipValue());
      }
    }
    case Kind::kObject: {
      TERN_RETURN_IF_ERROR(BeginObject());
      std::string key;
      while (true) {
        TERN_ASSIGN_OR_RETURN(bool more, NextKey(&key));
        if (!more) return Status::Ok();
        TERN_RETURN_IF_ERROR(SkipValue());
      }
    }
  }
  return Error("unreachable");
}

Status Reader::Finish() {
  if (!first_.empty()) return Error("unclosed object or array");
  SkipSpace();
  if (pos_ != text_.size()) return Error("trailing bytes after the JSON value");
  return Status::Ok();
}

}  // namespace tern::json
