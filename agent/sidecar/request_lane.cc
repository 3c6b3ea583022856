#include "agent/sidecar/request_lane.h"

#include <charconv>

namespace tern::agent {
namespace {

Status Bad(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }

std::string Describe(const Json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 40) + "...";
  return text + " (" + v.type_name() + ")";
}

Result<std::optional<uint64_t>> VersionField(const Json& lane, const char* key) {
  auto it = lane.find(key);
  if (it == lane.end() || it->is_null()) return std::optional<uint64_t>();
  if (it->is_number_unsigned()) return std::optional<uint64_t>(it->get<uint64_t>());
  return Bad(std::string("weight_version.") + key +
             " must be a non-negative integer or null, not " + Describe(*it));
}

Result<uint64_t> HeaderU64(std::string_view name, std::string_view text) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return Bad(std::string(name) + " must be a decimal integer, not \"" +
               std::string(text.substr(0, 40)) + "\"");
  return v;
}

std::string OptText(const std::optional<uint64_t>& v) {
  return v ? std::to_string(*v) : std::string("null");
}

std::string StampKeys(uint64_t start, uint64_t end) {
  return "\"weight_version_start\":" + std::to_string(start) +
         ",\"weight_version_end\":" + std::to_string(end);
}

// The stamped form of one "data:" payload, or nullopt to keep it.
std::optional<std::string> StampPayload(std::string_view payload, uint64_t start, uint64_t end,
                                        bool meta_info) {
  size_t p = payload.find_first_not_of(" \t");
  if (p == std::string_view::npos || payload[p] != '{') return std::nullopt;
  if (meta_info) {
    Json j = Json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
    StampResponse(j, start, end);
    return j.dump();
  }
  size_t q = payload.find_first_not_of(" \t\r\n", p + 1);
  std::string out(payload.substr(0, p + 1));
  out += StampKeys(start, end);
  if (q != std::string_view::npos && payload[q] != '}') out += ',';
  out += payload.substr(p + 1);
  return out;
}

}  // namespace

bool VersionConstraint::SatisfiedBy(std::optional<uint64_t> applied) const {
  if (!applied) return !min_version && !exact_version;
  if (exact_version) return *applied == *exact_version;
  return !min_version || *applied >= *min_version;
}

std::optional<uint64_t> VersionConstraint::Target() const {
  return exact_version ? exact_version : min_version;
}

std::string VersionConstraint::ToString() const {
  return "{min_version=" + OptText(min_version) + ", exact_version=" + OptText(exact_version) + "}";
}

Result<VersionConstraint> TakeConstraint(Json& body) {
  auto it = body.find("weight_version");
  if (it == body.end() || it->is_null()) {
    if (it != body.end()) body.erase(it);
    return VersionConstraint{};
  }
  if (!it->is_object())
    return Bad(
        "weight_version must be an object {\"min_version\": N|null, "
        "\"exact_version\": N|null}, not " +
        Describe(*it));
  for (const auto& [key, value] : it->items()) {
    if (key != "min_version" && key != "exact_version")
      return Bad("weight_version has an unknown key \"" + key.substr(0, 40) +
                 "\" (known: min_version, exact_version)");
  }
  VersionConstraint c;
  TERN_ASSIGN_OR_RETURN(c.min_version, VersionField(*it, "min_version"));
  TERN_ASSIGN_OR_RETURN(c.exact_version, VersionField(*it, "exact_version"));
  body.erase(it);
  return c;
}

Result<VersionConstraint> WithHeaders(VersionConstraint c, std::string_view min_version_header,
                                      std::string_view max_staleness_header, uint64_t head) {
  auto raise_floor = [&](uint64_t floor) {
    if (!c.min_version || *c.min_version < floor) c.min_version = floor;
  };
  if (!min_version_header.empty()) {
    TERN_ASSIGN_OR_RETURN(uint64_t v, HeaderU64("X-Tern-Min-Version", min_version_header));
    raise_floor(v);
  }
  if (!max_staleness_header.empty()) {
    TERN_ASSIGN_OR_RETURN(uint64_t s, HeaderU64("X-Tern-Max-Staleness", max_staleness_header));
    if (head > s) raise_floor(head - s);
  }
  if (c.exact_version && c.min_version && *c.exact_version < *c.min_version)
    return Bad("the request asks for exact version " + std::to_string(*c.exact_version) +
               " below its floor " + std::to_string(*c.min_version));
  return c;
}

std::string NotReadyBody(const VersionConstraint& c, std::optional<uint64_t> applied) {
  Json j;
  j["type"] = "WeightVersionNotReady";
  j["target_version"] = c.Target() ? Json(*c.Target()) : Json(nullptr);
  j["applied"] = applied ? Json(*applied) : Json(nullptr);
  j["message"] = "served version " + OptText(applied) + " does not satisfy " + c.ToString();
  return j.dump();
}

std::string ErrorBody(std::string_view type, std::string_view message, bool retryable) {
  Json j;
  j["error"]["type"] = type;
  j["error"]["message"] = message;
  j["error"]["retryable"] = retryable;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void StampResponse(Json& response, uint64_t start_version, uint64_t end_version) {
  if (!response.is_object()) return;
  auto meta = response.find("meta_info");
  Json& target = (meta != response.end() && meta->is_object()) ? *meta : response;
  if (&target != &response) target["weight_version"] = std::to_string(start_version);
  target["weight_version_start"] = start_version;
  target["weight_version_end"] = end_version;
}

std::string StampEvent(std::string_view event, uint64_t start_version, uint64_t end_version,
                       bool meta_info) {
  // Only an event with exactly one data line is stamped: splicing into one
  // of several lines would split a JSON value.
  size_t data_line = std::string_view::npos, data_lines = 0;
  for (size_t pos = 0; pos < event.size();) {
    size_t eol = event.find('\n', pos);
    if (eol == std::string_view::npos) eol = event.size();
    if (event.substr(pos, 5) == "data:") {
      ++data_lines;
      data_line = pos;
    }
    pos = eol + 1;
  }
  if (data_lines != 1) return std::string(event);
  size_t eol = event.find('\n', data_line);
  if (eol == std::string_view::npos) eol = event.size();
  size_t payload_at = data_line + 5;
  if (payload_at < eol && event[payload_at] == ' ') ++payload_at;
  size_t payload_end = eol;
  if (payload_end > payload_at && event[payload_end - 1] == '\r') --payload_end;
  auto stamped = StampPayload(event.substr(payload_at, payload_end - payload_at), start_version,
                              end_version, meta_info);
  if (!stamped) return std::string(event);
  std::string out(event.substr(0, payload_at));
  out += *stamped;
  out += event.substr(payload_end);
  return out;
}

void EventStamper::Feed(std::string_view piece, uint64_t end_version, std::string& out) {
  pending_.append(piece);
  size_t from = 0;
  for (;;) {
    // An event ends at a blank line: "\n\n" or "\n\r\n".
    size_t nl = pending_.find('\n', from);
    size_t term = std::string::npos, term_len = 0;
    while (nl != std::string::npos) {
      if (nl + 1 < pending_.size() && pending_[nl + 1] == '\n') {
        term = nl + 1, term_len = 1;
        break;
      }
      if (nl + 2 < pending_.size() && pending_[nl + 1] == '\r' && pending_[nl + 2] == '\n') {
        term = nl + 1, term_len = 2;
        break;
      }
      nl = pending_.find('\n', nl + 1);
    }
    if (term == std::string::npos) break;
    std::string_view event(pending_.data() + from, term - from);
    if (passthrough_) {
      out.append(event);
      passthrough_ = false;
    } else {
      out += StampEvent(event, start_, end_version, meta_info_);
    }
    out.append(pending_, term, term_len);
    from = term + term_len;
  }
  pending_.erase(0, from);
  if (passthrough_ || pending_.size() > max_event_bytes_) {
    passthrough_ = true;
    out += pending_;
    pending_.clear();
  }
}

void EventStamper::Flush(std::string& out) {
  out += pending_;
  pending_.clear();
}

}  // namespace tern::agent
