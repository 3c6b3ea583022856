// GET /view/rows (agent/daemon/view_rows.h) and FetchRankBase, its client
// (tern/agent.h).
#include "agent/daemon/view_rows.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/daemon/admin_jobs.h"
#include "tern/agent.h"

namespace tern::agent {
namespace {

constexpr size_t kMaxTensorNameBytes = 1024;

Result<std::vector<uint64_t>> ParseShape(std::string_view text) {
  std::vector<uint64_t> shape;
  if (text.empty()) return shape;  // a scalar
  size_t at = 0;
  while (true) {
    const size_t x = text.find('x', at);
    const std::string_view dim = text.substr(at, x == std::string_view::npos ? text.npos : x - at);
    uint64_t n = 0;
    auto [end, ec] = std::from_chars(dim.data(), dim.data() + dim.size(), n);
    TERN_REQUIRE(!dim.empty() && ec == std::errc() && end == dim.data() + dim.size(),
                 kInvalidArgument, "view rows: shape must be dimensions joined by 'x' (4096x1024)");
    shape.push_back(n);
    TERN_REQUIRE(shape.size() <= kMaxViewRowsDims, kInvalidArgument, "view rows: more than ",
                 kMaxViewRowsDims, " dimensions");
    if (x == std::string_view::npos) return shape;
    at = x + 1;
  }
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

std::string PercentEncoded(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '.' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace

Result<ViewRowsRequest> ParseViewRowsRequest(const AdminRequest& req) {
  ViewRowsRequest r;
  TERN_REQUIRE(NumberParam(req, "version", 1, UINT64_MAX, 0, &r.version) && r.version != 0,
               kInvalidArgument, "view rows: want version=V, a version from 1");
  TERN_REQUIRE(
      NumberParam(req, "first", 0, UINT64_MAX, UINT64_MAX, &r.first) && r.first != UINT64_MAX,
      kInvalidArgument, "view rows: want first=E, an element index");
  TERN_REQUIRE(NumberParam(req, "count", 1, UINT64_MAX, 0, &r.count) && r.count != 0,
               kInvalidArgument, "view rows: want count=N, a number of elements from 1");
  auto tensor = req.params.find("tensor");
  TERN_REQUIRE(tensor != req.params.end() && !tensor->second.empty() &&
                   tensor->second.size() <= kMaxTensorNameBytes,
               kInvalidArgument, "view rows: want tensor=NAME (percent-encoded, at most ",
               kMaxTensorNameBytes, " bytes)");
  r.tensor = tensor->second;
  auto dtype = req.params.find("dtype");
  std::optional<DType> d = dtype == req.params.end() ? std::nullopt : DTypeFromName(dtype->second);
  TERN_REQUIRE(d.has_value(), kInvalidArgument,
               "view rows: want dtype=D, a safetensors dtype (BF16)");
  r.dtype = *d;
  auto shape = req.params.find("shape");
  TERN_REQUIRE(shape != req.params.end(), kInvalidArgument,
               "view rows: want shape=AxB (shape= for a scalar)");
  TERN_ASSIGN_OR_RETURN(r.shape, ParseShape(shape->second));
  return r;
}

std::string ViewRowsPath(const ViewRowsRequest& r) {
  return "/view/rows?version=" + std::to_string(r.version) + "&tensor=" + PercentEncoded(r.tensor) +
         "&dtype=" + std::string(DTypeName(r.dtype)) + "&shape=" + ShapeText(r.shape) +
         "&first=" + std::to_string(r.first) + "&count=" + std::to_string(r.count);
}

Result<std::string> ReadViewRows(const ServeView& view, uint64_t served_version,
                                 const ViewRowsRequest& r) {
  const std::string name = r.tensor.substr(0, 200);
  TERN_REQUIRE(served_version == r.version, kMismatch, "view rows: this root serves version ",
               served_version, ", not ", r.version, " (", name, ")");
  const TensorRef* t = view.Find(r.tensor);
  TERN_REQUIRE(t != nullptr, kNotFound, "view rows: version ", r.version, " has no tensor ", name);
  const TensorDesc& d = *t->desc;
  TERN_REQUIRE(d.dtype == r.dtype && d.shape == r.shape, kMismatch, "view rows: ", name, " is ",
               DTypeName(d.dtype), " [", ShapeText(d.shape), "] in version ", r.version, ", not ",
               DTypeName(r.dtype), " [", ShapeText(r.shape), "]");
  const uint64_t n = d.elements();
  TERN_REQUIRE(r.first < n && r.count <= n - r.first, kOutOfRange, "view rows: elements [", r.first,
               ", +", r.count, ") are outside ", name, "'s ", n);
  if (ElementBits(d.dtype) == 4)
    TERN_REQUIRE(r.first % 2 == 0 && (r.count % 2 == 0 || r.first + r.count == n), kOutOfRange,
                 "view rows: elements [", r.first, ", +", r.count, ") of 4-bit ", name,
                 " are not byte-aligned");
  const uint64_t bytes = DTypeBytes(d.dtype, r.count);
  TERN_REQUIRE(bytes <= kMaxViewRowsBytes, kResourceExhausted, "view rows: ", bytes,
               " bytes asked of ", name, "; at most ", kMaxViewRowsBytes, " per request");
  const uint8_t* from = t->data + DTypeBytes(d.dtype, r.first);
  return std::string(reinterpret_cast<const char*>(from), bytes);
}

int ViewRowsHttpStatus(const Status& s) {
  return s.code() == Code::kResourceExhausted ? 413 : AdminHttpStatusOf(s);
}

}  // namespace tern::agent

namespace tern {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The root's HEAD and the version its view serves, from GET /status.
Result<std::pair<uint64_t, uint64_t>> RootVersions(const std::string& address,
                                                   const agent::AdminClientOptions& o) {
  TERN_ASSIGN_OR_RETURN(std::string reply, agent::AdminGet(address, "/status", o));
  const nlohmann::json j = nlohmann::json::parse(reply, nullptr, false);
  const std::string role = j.is_object() && j.contains("role") && j["role"].is_string()
                               ? j["role"].get<std::string>().substr(0, 40)
                               : "?";
  TERN_REQUIRE(role == "root", kInvalidArgument, "rank base: ", address,
               " is not a root's admin port (its status says role ", role, ")");
  TERN_REQUIRE(j.contains("head") && j["head"].is_number_unsigned() &&
                   j.contains("served_version") && j["served_version"].is_number_unsigned(),
               kProtocol, "rank base: the root's status has no head and served_version");
  return std::make_pair(j["head"].get<uint64_t>(), j["served_version"].get<uint64_t>());
}

// A request worth asking again: the root busy (503: publishing, or its
// port full), slow, or not answering; not its 500 (a lasting failure).
bool AskAgain(const Status& s) {
  if (s.code() == Code::kTimeout) return true;
  return s.code() == Code::kUnavailable && s.message().find(": 500") == std::string::npos;
}

// Sleeps `*pause_ms` (then doubles it, up to 500 ms) unless that would
// pass `deadline`: false then.
bool PauseBefore(SteadyClock::time_point deadline, uint32_t* pause_ms) {
  if (SteadyClock::now() + std::chrono::milliseconds(*pause_ms) >= deadline) return false;
  std::this_thread::sleep_for(std::chrono::milliseconds(*pause_ms));
  *pause_ms = std::min<uint32_t>(*pause_ms * 2, 500);
  return true;
}

}  // namespace

namespace agent {

Result<uint64_t> FetchRankBaseInPieces(const std::string& admin_address, RankPublisher& publisher,
                                       const AgentClientOptions& options, uint64_t piece_bytes) {
  TERN_REQUIRE(piece_bytes >= 1 && piece_bytes <= kMaxViewRowsBytes, kInvalidArgument,
               "rank base: pieces of 1..", kMaxViewRowsBytes, " bytes");
  TERN_REQUIRE(publisher.version() == 0, kMismatch, "rank base: the publisher holds version ",
               publisher.version(), "; only a new one (that has committed nothing) fetches a base");
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(options.timeout_ms);
  const AdminClientOptions status_request = AdminRequestOf(options);
  AdminClientOptions request = status_request;
  request.max_reply_bytes = piece_bytes + 4096;
  const std::string waited = " within the client's " + std::to_string(options.timeout_ms) + " ms";
  // A version the root published between two pieces is refused by the
  // piece after it ("serves version"): the fetch starts again at the new
  // HEAD, a few times.
  constexpr int kAttempts = 4;
  Status last;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    uint64_t head = 0;
    for (uint32_t pause_ms = 20;;) {
      auto versions = RootVersions(admin_address, UntilDeadline(status_request, deadline));
      if (!versions.ok()) {
        // A whole job restarting: many ranks ask at once, past the port's
        // connections (503) or workers; ask again until the deadline.
        if (AskAgain(versions.status()) && PauseBefore(deadline, &pause_ms)) continue;
        return versions.status().WithContext("rank base: the root's status");
      }
      head = versions->first;
      if (head == 0) return uint64_t{0};  // an empty board: the zero view it holds is HEAD's
      if (versions->second == head) break;
      // Applying HEAD to its own view (a moment), or a root that took the
      // board over and has published nothing since (until it does).
      if (!PauseBefore(deadline, &pause_ms))
        return TERN_ERROR(kUnavailable, "rank base: the root at ", admin_address,
                          " serves version ", versions->second, ", not HEAD ", head, waited,
                          " (it took the board over and has published nothing since): resume "
                          "from a member's slot of version ",
                          head);
    }
    bool moved = false;
    last = publisher.ResumeFrom(
        head,
        [&](const TensorDesc& d, const RankShardRange& range, std::span<uint8_t> into) -> Status {
          // Pieces of whole bytes: an even number of 4-bit elements.
          const uint64_t per_piece =
              std::max<uint64_t>(2, piece_bytes * 8 / ElementBits(d.dtype)) & ~uint64_t{1};
          for (uint64_t done = 0; done < range.element_count;) {
            ViewRowsRequest r;
            r.version = head;
            r.tensor = d.name;
            r.dtype = d.dtype;
            r.shape = d.shape;
            r.first = range.first_element + done;
            r.count = std::min(per_piece, range.element_count - done);
            const std::string path = ViewRowsPath(r);
            // The admin client sends at most 1000 bytes of path and query.
            TERN_REQUIRE(path.size() <= 1000, kInvalidArgument, "rank base: the name of tensor ",
                         d.name.substr(0, 200), " is too long to ask the root for (", path.size(),
                         " bytes of query, percent-encoded; at most 1000)");
            const std::string what = "rank base: " + d.name.substr(0, 200) + " elements [" +
                                     std::to_string(r.first) + ", +" + std::to_string(r.count) +
                                     ") of version " + std::to_string(head) + " from " +
                                     admin_address;
            Result<std::string> piece = TERN_ERROR(kInternal, "");
            bool busy = false;
            for (uint32_t pause_ms = 20;;) {
              piece = AdminGet(admin_address, path, UntilDeadline(request, deadline));
              if (piece.ok() || !AskAgain(piece.status())) break;
              // The root is publishing (503: its view is changing) or slow to
              // answer: ask again until the deadline.
              busy = busy || piece.status().message().find("publishing") != std::string::npos;
              if (!PauseBefore(deadline, &pause_ms)) break;
            }
            if (!piece.ok()) {
              if (piece.status().message().find("serves version") != std::string::npos)
                moved = true;
              if (busy)
                return TERN_ERROR(kTimeout, what, ": the root was publishing a version", waited,
                                  "; ask again (last: ", piece.status().message().substr(0, 200),
                                  ")");
              return piece.status().WithContext(what);
            }
            const uint64_t at = DTypeBytes(d.dtype, done);
            TERN_REQUIRE(
                piece->size() == DTypeBytes(d.dtype, r.count) && at + piece->size() <= into.size(),
                kProtocol, what, ": ", piece->size(), " bytes answered");
            std::memcpy(into.data() + at, piece->data(), piece->size());
            done += r.count;
          }
          return Status::Ok();
        });
    if (last.ok()) return head;
    if (!moved) return last;
  }
  return Status(Code::kMismatch, last.message() + " (HEAD moved " + std::to_string(kAttempts) +
                                     " times while the base was fetched)");
}

}  // namespace agent

Result<uint64_t> FetchRankBase(const std::string& admin_address, RankPublisher& publisher,
                               const AgentClientOptions& options) {
  return agent::FetchRankBaseInPieces(admin_address, publisher, options, agent::kMaxViewRowsBytes);
}

}  // namespace tern
