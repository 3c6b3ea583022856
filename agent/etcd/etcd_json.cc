#include "agent/etcd/etcd_json.h"

#include <array>

#include "base/text.h"

namespace tern::agent {
namespace {

using nlohmann::json;

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> DecodeTable() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  t['-'] = 62;  // URL-safe alphabet
  t['_'] = 63;
  return t;
}
constexpr std::array<int8_t, 256> kDecode = DecodeTable();

Result<std::string> StringField(const json& object, const char* name) {
  if (!object.contains(name)) return std::string();
  const json& v = object[name];
  TERN_REQUIRE(v.is_string(), kProtocol, "etcd: field '", name, "' is not a string");
  return v.get<std::string>();
}

Result<std::string> BytesField(const json& object, const char* name) {
  auto text = StringField(object, name);
  if (!text.ok()) return text;
  auto bytes = Base64Decode(*text);
  if (!bytes.ok()) return bytes.status().WithContext(std::string("etcd field ") + name);
  return bytes;
}

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t n = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t n = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (rest == 2) n |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += rest == 2 ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  TERN_REQUIRE(text.size() % 4 == 0, kProtocol, "base64 of length ", text.size(),
               " (not a multiple of 4)");
  size_t pad = 0;
  if (!text.empty() && text.back() == '=')
    pad = (text.size() >= 2 && text[text.size() - 2] == '=') ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const size_t data = last ? 4 - pad : 4;
    uint32_t n = 0;
    for (size_t k = 0; k < 4; ++k) {
      int8_t v = 0;
      if (k < data) {
        v = kDecode[static_cast<uint8_t>(text[i + k])];
        TERN_REQUIRE(v >= 0, kProtocol, "bad base64 character at ", i + k);
      }
      n = (n << 6) | static_cast<uint32_t>(v);
    }
    out += static_cast<char>((n >> 16) & 0xff);
    if (data >= 3) out += static_cast<char>((n >> 8) & 0xff);
    if (data == 4) out += static_cast<char>(n & 0xff);
    // Canonical: the bits that padding drops must be zero.
    TERN_REQUIRE(!(data == 2 && (n & 0xffff) != 0) && !(data == 3 && (n & 0xff) != 0), kProtocol,
                 "non-canonical base64 padding");
  }
  return out;
}

Result<int64_t> Int64Field(const json& object, const char* name) {
  TERN_REQUIRE(object.is_object(), kProtocol, "etcd: reply is not an object");
  if (!object.contains(name)) return int64_t{0};
  const json& v = object[name];
  if (v.is_number_integer()) return v.get<int64_t>();
  TERN_REQUIRE(v.is_string(), kProtocol, "etcd: field '", name, "' is not an integer");
  const std::string& s = v.get_ref<const std::string&>();
  // The gateway writes int64s as JSON strings: "-" and the magnitude's digits.
  const bool negative = !s.empty() && s[0] == '-';
  const uint64_t magnitude_max = negative ? uint64_t{1} << 63 : uint64_t{INT64_MAX};
  const Result<uint64_t> magnitude =
      ParseDecimal(std::string_view(s).substr(negative ? 1 : 0), magnitude_max);
  TERN_REQUIRE(magnitude.ok(), kProtocol, "etcd: field '", name, "' is not an int64: '",
               Printable(s.substr(0, 40)), "'");
  // Two's complement (C++20): 0 - 2^63 is INT64_MIN.
  return static_cast<int64_t>(negative ? 0 - *magnitude : *magnitude);
}

Result<bool> BoolField(const json& object, const char* name) {
  TERN_REQUIRE(object.is_object(), kProtocol, "etcd: reply is not an object");
  if (!object.contains(name)) return false;
  const json& v = object[name];
  TERN_REQUIRE(v.is_boolean(), kProtocol, "etcd: field '", name, "' is not a bool");
  return v.get<bool>();
}

Result<int64_t> HeaderRevision(const json& reply) {
  TERN_REQUIRE(reply.is_object() && reply.contains("header") && reply["header"].is_object(),
               kProtocol, "etcd: reply without a header");
  return Int64Field(reply["header"], "revision");
}

Result<EtcdRange> ParseRange(const json& reply, size_t max_kvs) {
  TERN_REQUIRE(reply.is_object(), kProtocol, "etcd: range reply is not an object");
  EtcdRange range;
  auto more = BoolField(reply, "more");
  if (!more.ok()) return std::move(more).take_status();
  range.more = *more;
  if (reply.contains("header")) {
    auto revision = HeaderRevision(reply);
    if (!revision.ok()) return std::move(revision).take_status();
    range.revision = *revision;
  }
  if (!reply.contains("kvs")) return range;
  const json& kvs = reply["kvs"];
  TERN_REQUIRE(kvs.is_array(), kProtocol, "etcd: kvs is not an array");
  TERN_REQUIRE(kvs.size() <= max_kvs, kProtocol, "etcd: ", kvs.size(),
               " entries in a range of at most ", max_kvs);
  for (const json& e : kvs) {
    TERN_REQUIRE(e.is_object(), kProtocol, "etcd: a kvs entry is not an object");
    EtcdKeyValue kv;
    auto key = BytesField(e, "key");
    if (!key.ok()) return std::move(key).take_status();
    TERN_REQUIRE(!key->empty(), kProtocol, "etcd: a kvs entry without a key");
    kv.key = std::move(*key);
    auto value = BytesField(e, "value");
    if (!value.ok()) return std::move(value).take_status();
    kv.value = std::move(*value);
    for (auto [field, out] : {std::pair{"create_revision", &kv.create_revision},
                              std::pair{"mod_revision", &kv.mod_revision},
                              std::pair{"version", &kv.version}, std::pair{"lease", &kv.lease}}) {
      auto n = Int64Field(e, field);
      if (!n.ok()) return std::move(n).take_status();
      *out = *n;
    }
    range.kvs.push_back(std::move(kv));
  }
  return range;
}

}  // namespace tern::agent
