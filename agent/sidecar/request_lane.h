// The request lane (docs/engines.md, "The sidecar"): what a rollout request
// says about the versions it accepts, and what a response says about the
// version that served it. Compatible with the seed system's lane
// (modal-projects/stitch: VersionConstraint in src/stitch/types.py, the
// proxy in src/stitch/service.py):
//
//   request body  "weight_version": {"min_version": N|null, "exact_version": N|null}
//                 (removed before the body is forwarded)
//   409 body      {"type": "WeightVersionNotReady", "target_version": T|null,
//                  "applied": A|null, "message": "..."}
//   stamps        "weight_version_start": S, "weight_version_end": E at the top
//                 level of a JSON response, or inside its "meta_info" object
//                 when it has one (SGLang's /generate)
//
// and tern's own headers: X-Tern-Min-Version: N and X-Tern-Max-Staleness: S
// on a request (S: at most S versions behind the newest the member knows),
// X-Tern-Version on a response.
//
// Stricter than the seed where it only refuses malformed input: a
// weight_version that is not an object, a key other than the two, or a value
// that is not a non-negative integer or null is a 400 (the seed ignores or
// coerces those). Pure functions, no I/O; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "tern/status.h"

namespace tern::agent {

// Bodies keep their keys' order when they are rewritten and forwarded.
using Json = nlohmann::ordered_json;

struct VersionConstraint {
  std::optional<uint64_t> min_version;
  std::optional<uint64_t> exact_version;

  // The seed's rule: nothing applied satisfies only an unconstrained
  // request; exact pins one version; min is a floor.
  bool SatisfiedBy(std::optional<uint64_t> applied) const;
  // What the request waits for: exact, else min (the 409's target_version).
  std::optional<uint64_t> Target() const;
  std::string ToString() const;  // "{min_version=3, exact_version=null}"
};

// Takes "weight_version" out of a request body (a JSON object) and parses it.
// kInvalidArgument with a message meant for the client on bad input; the
// body is left as it was then.
Result<VersionConstraint> TakeConstraint(Json& body);

// Folds tern's request headers into a constraint (empty views: header
// absent). `head` is the newest version the member knows (max staleness is
// counted from it). kInvalidArgument on a header that is not a decimal u64,
// or when the result asks for an exact version below its floor.
Result<VersionConstraint> WithHeaders(VersionConstraint c, std::string_view min_version_header,
                                      std::string_view max_staleness_header, uint64_t head);

// The 409 body for a request this replica cannot serve now.
std::string NotReadyBody(const VersionConstraint& c, std::optional<uint64_t> applied);

// {"error": {"type": T, "message": M, "retryable": R}} (the seed's shape for
// 403 and 503; tern uses it for 400 and 413 too).
std::string ErrorBody(std::string_view type, std::string_view message, bool retryable);

// Stamps a JSON response: into its "meta_info" object when it has one, else
// at the top level (a non-object is left alone).
void StampResponse(Json& response, uint64_t start_version, uint64_t end_version);

// Stamps one server-sent event (its bytes up to, not including, the blank
// line that ends it): a "data: {...}" line gets the stamps as the object's
// first keys, spliced in without re-encoding the rest; with `meta_info`,
// the event is parsed and stamped like StampResponse. Anything else
// ("data: [DONE]", comments, non-JSON data) is returned unchanged.
std::string StampEvent(std::string_view event, uint64_t start_version, uint64_t end_version,
                       bool meta_info);

// Splits a server-sent event stream, fed in arbitrary pieces, into whole
// events and stamps each. Holds at most max_event_bytes of an unfinished
// event; a longer one is passed through unstamped.
class EventStamper {
 public:
  EventStamper(uint64_t start_version, bool meta_info, size_t max_event_bytes = 1 << 20)
      : start_(start_version), meta_info_(meta_info), max_event_bytes_(max_event_bytes) {}
  // Appends to `out` every event completed by `piece`, stamped with
  // end_version (the version serving now).
  void Feed(std::string_view piece, uint64_t end_version, std::string& out);
  // What is left of an unfinished event, unchanged.
  void Flush(std::string& out);

 private:
  const uint64_t start_;
  const bool meta_info_;
  const size_t max_event_bytes_;
  std::string pending_;
  bool passthrough_ = false;  // the current event grew past the bound
};

}  // namespace tern::agent
