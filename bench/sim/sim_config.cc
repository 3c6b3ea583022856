#include "bench/sim/sim_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

namespace tern::sim {
namespace {

using json = nlohmann::json;

constexpr double kGbit = 1e9 / 8;  // bytes per second in one Gbit/s

// Reads an optional number field; an absent one keeps *out. The parser is
// built with exceptions off for type errors: every access checks the type.
Status Num(const json& j, const char* key, double* out, double min = -INFINITY) {
  if (!j.is_object() || !j.contains(key)) return Status::Ok();
  const json& v = j.at(key);
  TERN_REQUIRE(v.is_number(), kInvalidArgument, "'", key, "' is not a number");
  const double x = v.get<double>();
  TERN_REQUIRE(std::isfinite(x) && x >= min, kInvalidArgument, "'", key, "' = ", x,
               " is out of range");
  *out = x;
  return Status::Ok();
}
Status Scaled(const json& j, const char* key, double scale, double* out) {
  double x = NAN;
  TERN_RETURN_IF_ERROR(Num(j, key, &x, 0));
  if (!std::isnan(x)) *out = x * scale;
  return Status::Ok();
}
template <typename U>
Status Int(const json& j, const char* key, U* out) {
  double x = static_cast<double>(*out);
  TERN_RETURN_IF_ERROR(Num(j, key, &x, 0));
  TERN_REQUIRE(x == std::floor(x) && x <= 1e15, kInvalidArgument, "'", key, "' is not an integer");
  *out = static_cast<U>(x);
  return Status::Ok();
}
Status Str(const json& j, const char* key, std::string* out) {
  if (!j.is_object() || !j.contains(key)) return Status::Ok();
  TERN_REQUIRE(j.at(key).is_string(), kInvalidArgument, "'", key, "' is not a string");
  *out = j.at(key).get<std::string>();
  return Status::Ok();
}
Status Bool(const json& j, const char* key, bool* out) {
  if (!j.is_object() || !j.contains(key)) return Status::Ok();
  TERN_REQUIRE(j.at(key).is_boolean(), kInvalidArgument, "'", key, "' is not true or false");
  *out = j.at(key).get<bool>();
  return Status::Ok();
}
// A measured figure is {"value": x, "source": "..."}; a bare number is
// accepted too (tests).
const json& ValueOf(const json& v) {
  return v.is_object() && v.contains("value") ? v.at("value") : v;
}
Status Measured(const json& costs, const char* key, double* out, double min = 0) {
  if (!costs.contains(key)) return TERN_ERROR(kInvalidArgument, "costs: '", key, "' is missing");
  json wrap = json::object();
  wrap[key] = ValueOf(costs.at(key));
  return Num(wrap, key, out, min);
}
Status ReadCurve(const json& costs, const char* key, Curve* out) {
  TERN_REQUIRE(costs.contains(key), kInvalidArgument, "costs: '", key, "' is missing");
  const json& pts = ValueOf(costs.at(key));
  TERN_REQUIRE(pts.is_array() && !pts.empty() && pts.size() <= 64, kInvalidArgument, "costs: '",
               key, "' must be a list of [x, y] pairs");
  out->points.clear();
  for (const json& p : pts) {
    TERN_REQUIRE(p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number(),
                 kInvalidArgument, "costs: '", key, "' has an entry that is not [x, y]");
    const double x = p[0].get<double>(), y = p[1].get<double>();
    TERN_REQUIRE(x > 0 && std::isfinite(x) && std::isfinite(y) && y >= 0, kInvalidArgument,
                 "costs: '", key, "' has a bad point");
    out->points.emplace_back(x, y);
  }
  std::sort(out->points.begin(), out->points.end());
  return Status::Ok();
}

Result<json> Parse(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  TERN_REQUIRE(!j.is_discarded() && j.is_object(), kInvalidArgument, "not a JSON object");
  return j;
}

}  // namespace

double Curve::At(double x) const {
  if (points.empty()) return 0;
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  for (size_t i = 1; i < points.size(); ++i) {
    if (x > points[i].first) continue;
    const auto& [x0, y0] = points[i - 1];
    const auto& [x1, y1] = points[i];
    const double t = std::log(x / x0) / std::log(x1 / x0);
    return y0 + t * (y1 - y0);
  }
  return points.back().second;
}

Result<Costs> ParseCosts(const std::string& text) {
  TERN_ASSIGN_OR_RETURN(json j, Parse(text));
  Costs c;
  TERN_RETURN_IF_ERROR(Measured(j, "wan_efficiency", &c.wan_efficiency));
  TERN_RETURN_IF_ERROR(Measured(j, "lan_efficiency", &c.lan_efficiency));
  TERN_RETURN_IF_ERROR(Measured(j, "mss_bytes", &c.mss_bytes, 1));
  TERN_RETURN_IF_ERROR(Measured(j, "mathis_c", &c.mathis_c));
  double cap_gbit = 0;
  TERN_RETURN_IF_ERROR(Measured(j, "per_flow_cap_gbit_s", &cap_gbit));
  c.per_flow_cap_bytes_per_s = cap_gbit * kGbit;
  double relay_s_per_gb = 0;
  TERN_RETURN_IF_ERROR(Measured(j, "relay_cpu_s_per_gb", &relay_s_per_gb));
  c.relay_s_per_byte = relay_s_per_gb / 1e9;
  double hop_ms = 0;
  TERN_RETURN_IF_ERROR(Measured(j, "hop_ms_per_chunk", &hop_ms));
  c.hop_s_per_chunk = hop_ms / 1e3;
  TERN_RETURN_IF_ERROR(ReadCurve(j, "bits_per_changed_value_format1", &c.bits_per_change));
  TERN_RETURN_IF_ERROR(Measured(j, "format2_over_format1", &c.format2_ratio));
  TERN_REQUIRE(j.contains("view_bytes_per_param"), kInvalidArgument,
               "costs: 'view_bytes_per_param' is missing");
  const json& vb = ValueOf(j.at("view_bytes_per_param"));
  TERN_REQUIRE(vb.is_object(), kInvalidArgument, "costs: 'view_bytes_per_param' is not an object");
  for (const auto& [name, v] : vb.items()) {
    TERN_REQUIRE(v.is_number() && v.get<double>() > 0, kInvalidArgument,
                 "costs: bad bytes per param for ", name);
    c.view_bytes_per_param.emplace_back(name, v.get<double>());
  }
  TERN_RETURN_IF_ERROR(ReadCurve(j, "apply_per_memcpy_per_core_format1", &c.apply_per_memcpy[0]));
  TERN_RETURN_IF_ERROR(ReadCurve(j, "apply_per_memcpy_per_core_format2", &c.apply_per_memcpy[1]));
  TERN_RETURN_IF_ERROR(ReadCurve(j, "encode_per_memcpy_per_core_format1", &c.encode_per_memcpy[0]));
  TERN_RETURN_IF_ERROR(ReadCurve(j, "encode_per_memcpy_per_core_format2", &c.encode_per_memcpy[1]));
  double memcpy_gb = 0;
  TERN_RETURN_IF_ERROR(Measured(j, "memcpy_gb_s_per_core", &memcpy_gb));
  TERN_REQUIRE(memcpy_gb > 0, kInvalidArgument, "costs: memcpy_gb_s_per_core must be > 0");
  c.memcpy_bytes_per_s = memcpy_gb * 1e9;
  TERN_RETURN_IF_ERROR(Measured(j, "http_efficiency", &c.http_efficiency));
  TERN_RETURN_IF_ERROR(Measured(j, "stream_apply_tail_fraction", &c.stream_apply_tail));
  TERN_REQUIRE(c.stream_apply_tail >= 0 && c.stream_apply_tail <= 1, kInvalidArgument,
               "costs: stream_apply_tail_fraction must be in [0, 1]");
  double offer_ms = 0;
  TERN_RETURN_IF_ERROR(Measured(j, "offer_after_ready_ms", &offer_ms));
  TERN_REQUIRE(offer_ms >= 0 && offer_ms < 1e6, kInvalidArgument,
               "costs: offer_after_ready_ms out of range");
  c.offer_delay_s = offer_ms / 1e3;
  TERN_REQUIRE(c.wan_efficiency > 0 && c.wan_efficiency <= 1 && c.lan_efficiency > 0 &&
                   c.lan_efficiency <= 1 && c.http_efficiency > 0 && c.http_efficiency <= 1,
               kInvalidArgument, "costs: efficiencies must be in (0, 1]");
  return c;
}

Result<Scenario> ParseScenario(const std::string& text) {
  TERN_ASSIGN_OR_RETURN(json j, Parse(text));
  Scenario s;
  TERN_RETURN_IF_ERROR(Str(j, "name", &s.name));
  const json empty = json::object();
  const json& model = j.contains("model") ? j.at("model") : empty;
  TERN_RETURN_IF_ERROR(Num(model, "params", &s.params, 0));
  TERN_RETURN_IF_ERROR(Str(model, "format", &s.format));
  TERN_RETURN_IF_ERROR(Num(model, "changed_fraction", &s.changed_fraction, 0));
  TERN_REQUIRE(s.changed_fraction <= 1, kInvalidArgument, "changed_fraction > 1");
  TERN_RETURN_IF_ERROR(Int(model, "patch_format", &s.patch_format));
  TERN_REQUIRE(s.patch_format == 1 || s.patch_format == 2, kInvalidArgument,
               "patch_format is 1 or 2");
  TERN_RETURN_IF_ERROR(Num(model, "patch_bytes", &s.patch_bytes, 0));

  TERN_REQUIRE(j.contains("topology") && j.at("topology").is_object(), kInvalidArgument,
               "'topology' is missing");
  const json& t = j.at("topology");
  TERN_RETURN_IF_ERROR(Str(t, "root_region", &s.root_region));
  TERN_RETURN_IF_ERROR(Scaled(t, "root_uplink_gbit_s", kGbit, &s.root_uplink_bytes_per_s));
  TERN_REQUIRE(s.root_uplink_bytes_per_s > 0, kInvalidArgument, "root_uplink_gbit_s must be > 0");
  TERN_REQUIRE(t.contains("regions") && t.at("regions").is_array() && !t.at("regions").empty() &&
                   t.at("regions").size() <= 64,
               kInvalidArgument, "'topology.regions' must be a list of 1..64 regions");
  std::set<std::string> names;
  for (const json& r : t.at("regions")) {
    RegionSpec rs;
    TERN_RETURN_IF_ERROR(Str(r, "name", &rs.name));
    TERN_REQUIRE(!rs.name.empty() && names.insert(rs.name).second, kInvalidArgument,
                 "region names must be non-empty and unique");
    TERN_RETURN_IF_ERROR(Int(r, "islands", &rs.islands));
    TERN_RETURN_IF_ERROR(Int(r, "clusters", &rs.clusters));
    TERN_REQUIRE(rs.clusters >= 1 && rs.islands <= 1u << 20, kInvalidArgument, "region ", rs.name,
                 ": clusters >= 1, islands <= 2^20");
    TERN_RETURN_IF_ERROR(
        Scaled(r, "island_downlink_gbit_s", kGbit, &rs.island_downlink_bytes_per_s));
    rs.island_uplink_bytes_per_s = rs.island_downlink_bytes_per_s;
    TERN_RETURN_IF_ERROR(Scaled(r, "island_uplink_gbit_s", kGbit, &rs.island_uplink_bytes_per_s));
    TERN_REQUIRE(rs.island_downlink_bytes_per_s > 0 && rs.island_uplink_bytes_per_s > 0,
                 kInvalidArgument, "region ", rs.name, ": island rates must be > 0");
    TERN_RETURN_IF_ERROR(Scaled(r, "one_way_ms", 1e-3, &rs.one_way_s));
    TERN_RETURN_IF_ERROR(Scaled(r, "cluster_one_way_ms", 1e-3, &rs.cluster_one_way_s));
    TERN_RETURN_IF_ERROR(Num(r, "loss", &rs.lan_loss, 0));
    TERN_RETURN_IF_ERROR(Scaled(r, "ingress_gbit_s", kGbit, &rs.ingress_bytes_per_s));
    s.regions.push_back(rs);
  }
  TERN_REQUIRE(names.count(s.root_region), kInvalidArgument, "root_region '", s.root_region,
               "' is not a region");
  if (t.contains("links")) {
    TERN_REQUIRE(t.at("links").is_array() && t.at("links").size() <= 64 * 64, kInvalidArgument,
                 "'topology.links' must be a list");
    for (const json& l : t.at("links")) {
      WanLinkSpec ls;
      TERN_RETURN_IF_ERROR(Str(l, "a", &ls.a));
      TERN_RETURN_IF_ERROR(Str(l, "b", &ls.b));
      TERN_REQUIRE(names.count(ls.a) && names.count(ls.b) && ls.a != ls.b, kInvalidArgument,
                   "link ", ls.a, "-", ls.b, ": unknown or equal regions");
      TERN_RETURN_IF_ERROR(Scaled(l, "rate_gbit_s", kGbit, &ls.rate_bytes_per_s));
      TERN_REQUIRE(ls.rate_bytes_per_s > 0, kInvalidArgument, "link ", ls.a, "-", ls.b,
                   ": rate must be > 0");
      TERN_RETURN_IF_ERROR(Scaled(l, "one_way_ms", 1e-3, &ls.one_way_s));
      TERN_RETURN_IF_ERROR(Num(l, "loss", &ls.loss, 0));
      TERN_REQUIRE(ls.loss < 1, kInvalidArgument, "link loss must be < 1");
      s.links.push_back(ls);
    }
  }

  const json& plan = j.contains("plan") ? j.at("plan") : empty;
  TERN_RETURN_IF_ERROR(Int(plan, "fanout_max", &s.plan.fanout_max));
  TERN_RETURN_IF_ERROR(Int(plan, "root_fanout_max", &s.plan.root_fanout_max));
  TERN_RETURN_IF_ERROR(Int(plan, "stripes", &s.plan.stripes));
  TERN_RETURN_IF_ERROR(Str(plan, "build", &s.plan_build));
  TERN_REQUIRE(s.plan_build == "joins" || s.plan_build == "batch", kInvalidArgument,
               "plan.build is joins or batch");

  const json& tr = j.contains("transport") ? j.at("transport") : empty;
  TERN_RETURN_IF_ERROR(Int(tr, "chunk_bytes", &s.chunk_bytes));
  TERN_REQUIRE(s.chunk_bytes == 0 || (s.chunk_bytes >= 4096 && s.chunk_bytes <= (1ull << 32)),
               kInvalidArgument, "chunk_bytes out of range");
  TERN_RETURN_IF_ERROR(Int(tr, "window_chunks", &s.window_chunks));
  TERN_REQUIRE(s.window_chunks >= 1 && s.window_chunks <= 4096, kInvalidArgument,
               "window_chunks in 1..4096");
  TERN_RETURN_IF_ERROR(Int(tr, "push_window_bytes", &s.push_window_bytes));
  TERN_RETURN_IF_ERROR(Int(tr, "streams", &s.streams));
  TERN_REQUIRE(s.streams >= 1 && s.streams <= 64, kInvalidArgument, "streams in 1..64");
  TERN_RETURN_IF_ERROR(Str(tr, "congestion", &s.congestion));
  TERN_REQUIRE(s.congestion == "bbr" || s.congestion == "cubic", kInvalidArgument,
               "congestion is bbr or cubic");

  const json& host = j.contains("hosts") ? j.at("hosts") : empty;
  TERN_RETURN_IF_ERROR(Num(host, "apply_cores", &s.apply_cores, 0));
  TERN_RETURN_IF_ERROR(Num(host, "encode_cores", &s.encode_cores, 0));
  TERN_REQUIRE(s.apply_cores > 0 && s.encode_cores > 0, kInvalidArgument, "cores must be > 0");
  TERN_RETURN_IF_ERROR(Scaled(host, "memcpy_gb_s_per_core", 1e9, &s.memcpy_bytes_per_s));
  TERN_RETURN_IF_ERROR(Num(host, "relay_cores", &s.relay_cores, 0));
  TERN_RETURN_IF_ERROR(Num(host, "shared_apply_cores", &s.shared_apply_cores, 0));
  if (host.contains("stream_apply")) {
    TERN_REQUIRE(host.at("stream_apply").is_boolean(), kInvalidArgument,
                 "hosts.stream_apply is true or false");
    s.stream_apply = host.at("stream_apply").get<bool>();
  }

  TERN_RETURN_IF_ERROR(Int(j, "versions", &s.versions));
  TERN_REQUIRE(s.versions >= 1 && s.versions <= 100000, kInvalidArgument, "versions in 1..100000");
  TERN_RETURN_IF_ERROR(Num(j, "version_interval_s", &s.version_interval_s, 0));
  const json& f = j.contains("failures") ? j.at("failures") : empty;
  TERN_RETURN_IF_ERROR(Num(f, "relay_failures_per_hour", &s.failures.relay_failures_per_hour, 0));
  TERN_RETURN_IF_ERROR(Num(f, "detect_s", &s.failures.detect_s, 0));
  TERN_RETURN_IF_ERROR(Num(f, "repair_s", &s.failures.repair_s, 0));
  TERN_RETURN_IF_ERROR(Int(f, "seed", &s.failures.seed));
  if (f.contains("at")) {
    TERN_REQUIRE(f.at("at").is_array() && f.at("at").size() <= 100000, kInvalidArgument,
                 "failures.at must be a list of {t_s, island}");
    for (const json& e : f.at("at")) {
      double t = -1;
      std::string island;
      TERN_RETURN_IF_ERROR(Num(e, "t_s", &t, 0));
      TERN_RETURN_IF_ERROR(Str(e, "island", &island));
      TERN_REQUIRE(t >= 0 && !island.empty(), kInvalidArgument,
                   "failures.at entries need t_s >= 0 and island");
      s.failures.at.emplace_back(t, island);
    }
  }
  const json& b = j.contains("baselines") ? j.at("baselines") : empty;
  TERN_RETURN_IF_ERROR(Scaled(b, "store_egress_gbit_s", kGbit, &s.store_egress_bytes_per_s));
  TERN_RETURN_IF_ERROR(Int(b, "http_streams", &s.baseline_http_streams));
  TERN_REQUIRE(s.baseline_http_streams >= 1 && s.baseline_http_streams <= 64, kInvalidArgument,
               "http_streams in 1..64");
  bool unused = false;
  TERN_RETURN_IF_ERROR(Bool(j, "pretty", &unused));
  return s;
}

Result<double> ViewBytes(const Scenario& s, const Costs& c) {
  for (const auto& [name, bpp] : c.view_bytes_per_param)
    if (name == s.format) return s.params * bpp;
  return TERN_ERROR(kInvalidArgument, "costs: no view_bytes_per_param for format '", s.format, "'");
}

Result<double> PatchBytes(const Scenario& s, const Costs& c) {
  if (s.patch_bytes > 0) return s.patch_bytes;
  TERN_REQUIRE(s.params > 0 && s.changed_fraction > 0, kInvalidArgument,
               "model: params and changed_fraction (or patch_bytes) are needed");
  TERN_ASSIGN_OR_RETURN(double view, ViewBytes(s, c));
  (void)view;  // the format must be known even though the size follows the changes
  const double bits =
      c.bits_per_change.At(s.changed_fraction) * (s.patch_format == 2 ? c.format2_ratio : 1.0);
  return s.params * s.changed_fraction * bits / 8;
}

}  // namespace tern::sim
