// GET /view/rows' request and reply (view_rows.h) without an agent: the
// query parsed back from the path a client sends, each refusal, and the
// bytes of a range (packed 4-bit ranges included).
#include "agent/daemon/view_rows.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tern::agent {
namespace {

// The path's query as the server's AdminRequest holds it (decoded).
AdminRequest RequestOf(const std::string& path) {
  AdminRequest req;
  const std::string query = path.substr(path.find('?') + 1);
  size_t at = 0;
  while (at <= query.size()) {
    const size_t amp = std::min(query.find('&', at), query.size());
    const std::string kv = query.substr(at, amp - at);
    const size_t eq = kv.find('=');
    std::string value;
    for (size_t i = eq + 1; i < kv.size(); ++i) {
      if (kv[i] == '%') {
        value += static_cast<char>(std::stoi(kv.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        value += kv[i];
      }
    }
    req.params[kv.substr(0, eq)] = value;
    at = amp + 1;
  }
  return req;
}

struct Fixture {
  TensorDesc w{"model.layers.0/w+q", DType::kBF16, {4, 8}};
  TensorDesc f4{"packed", DType::kF4, {3, 5}};  // 15 elements, 8 bytes
  std::vector<uint8_t> w_bytes, f4_bytes;
  ServeView view;
  Fixture() {
    for (int i = 0; i < 64; ++i) w_bytes.push_back(static_cast<uint8_t>(i));
    for (int i = 0; i < 8; ++i) f4_bytes.push_back(static_cast<uint8_t>(0xa0 + i));
    view.tensors = {{&f4, f4_bytes.data()}, {&w, w_bytes.data()}};
  }
  ViewRowsRequest Rows(const TensorDesc& d, uint64_t first, uint64_t count, uint64_t version = 3) {
    ViewRowsRequest r;
    r.version = version;
    r.tensor = d.name;
    r.dtype = d.dtype;
    r.shape = d.shape;
    r.first = first;
    r.count = count;
    return r;
  }
};

TEST(ViewRows, AClientsPathParsesBackToItsRequest) {
  Fixture f;
  const std::string path = ViewRowsPath(f.Rows(f.w, 8, 16));
  // Only characters the admin client sends (the name's '/' and '+' encoded).
  const std::string query = path.substr(path.find('?'));
  EXPECT_EQ(query.find('/'), std::string::npos) << path;
  EXPECT_EQ(query.find('+'), std::string::npos) << path;
  auto r = ParseViewRowsRequest(RequestOf(path));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, 3u);
  EXPECT_EQ(r->tensor, f.w.name);
  EXPECT_EQ(r->dtype, DType::kBF16);
  EXPECT_EQ(r->shape, f.w.shape);
  EXPECT_EQ(r->first, 8u);
  EXPECT_EQ(r->count, 16u);
  // A scalar's shape is empty.
  TensorDesc scalar{"s", DType::kF32, {}};
  auto s = ParseViewRowsRequest(RequestOf(ViewRowsPath(f.Rows(scalar, 0, 1))));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->shape.empty());
}

TEST(ViewRows, MalformedQueriesAreRefusedNamingTheParameter) {
  Fixture f;
  const std::string good = ViewRowsPath(f.Rows(f.w, 0, 4));
  struct Case {
    const char* param;
    const char* value;  // nullptr: removed
    const char* says;
  };
  for (const Case& c :
       std::vector<Case>{{"version", "0", "version=V"},
                         {"version", nullptr, "version=V"},
                         {"first", "-1", "first=E"},
                         {"count", "0", "count=N"},
                         {"count", "1e3", "count=N"},
                         {"tensor", "", "tensor=NAME"},
                         {"dtype", "BF17", "dtype=D"},
                         {"shape", nullptr, "shape=AxB"},
                         {"shape", "4xx8", "joined by 'x'"},
                         {"shape", "4x8x", "joined by 'x'"},
                         {"shape", "1x1x1x1x1x1x1x1x1x1x1x1x1x1x1x1x1", "dimensions"}}) {
    AdminRequest req = RequestOf(good);
    if (c.value)
      req.params[c.param] = c.value;
    else
      req.params.erase(c.param);
    auto r = ParseViewRowsRequest(req);
    ASSERT_FALSE(r.ok()) << c.param;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().ToString();
  }
  AdminRequest long_name = RequestOf(good);
  long_name.params["tensor"] = std::string(1025, 'a');
  EXPECT_FALSE(ParseViewRowsRequest(long_name).ok());
}

TEST(ViewRows, TheRangesBytesComeFromTheServedVersion) {
  Fixture f;
  auto rows = ReadViewRows(f.view, 3, f.Rows(f.w, 8, 16));
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(*rows, std::string(reinterpret_cast<const char*>(f.w_bytes.data()) + 16, 32));
  // Packed 4-bit: elements [4, 15) are bytes [2, 8), the last half-byte
  // the tensor's end.
  auto packed = ReadViewRows(f.view, 3, f.Rows(f.f4, 4, 11));
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  EXPECT_EQ(*packed, std::string(reinterpret_cast<const char*>(f.f4_bytes.data()) + 2, 6));
}

TEST(ViewRows, RefusalsSayWhatDiffersAndMapToTheirHttpStatus) {
  Fixture f;
  struct Case {
    ViewRowsRequest r;
    Code code;
    int http;
    const char* says;
  };
  ViewRowsRequest other_dtype = f.Rows(f.w, 0, 4);
  other_dtype.dtype = DType::kF16;
  ViewRowsRequest other_shape = f.Rows(f.w, 0, 4);
  other_shape.shape = {8, 4};
  ViewRowsRequest missing = f.Rows(f.w, 0, 4);
  missing.tensor = "model.nope";
  for (const Case& c : std::vector<Case>{
           {f.Rows(f.w, 0, 4, /*version=*/2), Code::kMismatch, 409, "serves version 3, not 2"},
           {missing, Code::kNotFound, 404, "has no tensor model.nope"},
           {other_dtype, Code::kMismatch, 409, "is BF16 [4x8] in version 3, not F16 [4x8]"},
           {other_shape, Code::kMismatch, 409, "not BF16 [8x4]"},
           {f.Rows(f.w, 30, 4), Code::kOutOfRange, 409, "outside"},
           {f.Rows(f.w, 32, 1), Code::kOutOfRange, 409, "outside"},
           {f.Rows(f.f4, 1, 4), Code::kOutOfRange, 409, "not byte-aligned"},
           {f.Rows(f.f4, 4, 3), Code::kOutOfRange, 409, "not byte-aligned"}}) {
    auto rows = ReadViewRows(f.view, 3, c.r);
    ASSERT_FALSE(rows.ok()) << c.says;
    EXPECT_EQ(rows.status().code(), c.code) << rows.status().ToString();
    EXPECT_EQ(ViewRowsHttpStatus(rows.status()), c.http) << rows.status().ToString();
    EXPECT_NE(rows.status().message().find(c.says), std::string::npos) << rows.status().ToString();
  }
}

TEST(ViewRows, MoreThanOneRequestsBoundIsRefused) {
  // A tensor of kMaxViewRowsBytes + 2 bytes, never read: the bound is
  // checked before any byte is.
  TensorDesc big{"big", DType::kU8, {kMaxViewRowsBytes + 2}};
  ServeView view;
  view.tensors = {{&big, nullptr}};
  ViewRowsRequest r;
  r.version = 1;
  r.tensor = "big";
  r.dtype = DType::kU8;
  r.shape = big.shape;
  r.count = kMaxViewRowsBytes + 1;
  auto rows = ReadViewRows(view, 1, r);
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(ViewRowsHttpStatus(rows.status()), 413);
  EXPECT_NE(rows.status().message().find("at most"), std::string::npos) << rows.status().ToString();
}

}  // namespace
}  // namespace tern::agent
