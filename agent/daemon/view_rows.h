// GET /view/rows: a root's own bytes of one tensor's element range, so that
// a trainer rank whose process restarted rebuilds its previous view from
// the root itself (FetchRankBase in tern/agent.h; the C API's
// tern_rank_publisher_rebase, Python's Publisher.rebase) instead of
// reading a member's slot. Spec: docs/agent/operations.md "Publishing from
// trainer ranks".
//
//   GET /view/rows?version=V&tensor=NAME&dtype=D&shape=AxB&first=E&count=N
//
// answers the raw bytes (application/octet-stream) of elements
// [E, E+N) of NAME in the view the root serves, when that view is version
// V and NAME has dtype D and shape AxB (scalar: shape=). The token is
// needed (the bytes are the model's weights). At most kMaxViewRowsBytes
// per request; a 4-bit range starts at an even element and has an even
// count unless it ends the tensor (the bytes of a packed range). Refusals,
// one line each: 400 a missing or malformed parameter; 404 no such tensor;
// 409 another version served ("serves version X"), another dtype or
// shape, a range outside the tensor or not byte-aligned; 413 over
// kMaxViewRowsBytes; 503 the root is publishing a version (its view is
// changing: ask again). Only a root registers it.
//
// The bytes are read from the served slot while the root holds its
// publish lock, so no version is applied to it meanwhile; each request is
// one version's bytes, and a client fetching several pieces names the
// version in each, so a version published between two pieces is a 409,
// never a mix of two versions.
//
// Thread safety: free functions on their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agent/ops/admin_http.h"
#include "tern/agent.h"
#include "tern/dtype.h"
#include "tern/rank_publish.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern::agent {

inline constexpr uint64_t kMaxViewRowsBytes = uint64_t{8} << 20;
inline constexpr size_t kMaxViewRowsDims = 16;

struct ViewRowsRequest {
  uint64_t version = 0;
  std::string tensor;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t first = 0, count = 0;
};

// The query's fields; kInvalidArgument saying which is missing or malformed.
Result<ViewRowsRequest> ParseViewRowsRequest(const AdminRequest& req);

// The path and query a client sends for `r` (the tensor's name
// percent-encoded byte by byte outside [A-Za-z0-9_.-]).
std::string ViewRowsPath(const ViewRowsRequest& r);

// The bytes of r's range in `view`, which serves `served_version`:
// kMismatch for another version ("serves version X"), another dtype or
// shape; kNotFound for no such tensor; kOutOfRange for a range outside the
// tensor or a 4-bit range not byte-aligned; kResourceExhausted over
// kMaxViewRowsBytes. Every message names the tensor.
Result<std::string> ReadViewRows(const ServeView& view, uint64_t served_version,
                                 const ViewRowsRequest& r);

// The HTTP status GET /view/rows answers ReadViewRows' error with.
int ViewRowsHttpStatus(const Status& s);

// FetchRankBase (tern/agent.h) asking for pieces of at most `piece_bytes`
// (1..kMaxViewRowsBytes): tests fetch a small view in many pieces.
Result<uint64_t> FetchRankBaseInPieces(const std::string& admin_address, RankPublisher& publisher,
                                       const AgentClientOptions& options, uint64_t piece_bytes);

}  // namespace tern::agent
