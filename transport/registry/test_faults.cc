#include "transport/registry/test_faults.h"

#include <charconv>
#include <string>

#include "tern/transport_registry.h"

namespace tern {
namespace transport_internal {
namespace {

// Plain decimal digits only (no sign, space or hex), at most UINT64_MAX.
Result<uint64_t> ParseU64(std::string_view key, std::string_view text) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  TERN_REQUIRE(!text.empty() && ec == std::errc() && end == text.data() + text.size(), kInvalidArgument,
               "fault policy: ", key, "=", text, " is not a decimal u64");
  return v;
}

}  // namespace

Result<FaultPolicy> ParseFaultPolicy(std::string_view text) {
  FaultPolicy p;
  TERN_REQUIRE(!text.empty(), kInvalidArgument, "fault policy: empty");
  for (bool more = true; more;) {
    const size_t comma = text.find(',');
    more = comma != std::string_view::npos;
    const std::string_view item = text.substr(0, comma);
    text = more ? text.substr(comma + 1) : std::string_view{};
    const size_t eq = item.find('=');
    TERN_REQUIRE(eq != std::string_view::npos, kInvalidArgument,
                 "fault policy: '", item, "' is not KEY=VALUE");
    const std::string_view key = item.substr(0, eq);
    TERN_ASSIGN_OR_RETURN(const uint64_t v, ParseU64(key, item.substr(eq + 1)));
    const auto u32 = [&](uint32_t* field) -> Status {
      TERN_REQUIRE(v <= UINT32_MAX, kInvalidArgument,
                   "fault policy: ", key, " is a u32");
      *field = static_cast<uint32_t>(v);
      return Status::Ok();
    };
    if (key == "seed") {
      p.seed = v;
    } else if (key == "corrupt_at_byte") {
      p.corrupt_at_byte = v;
    } else if (key == "tamper_at_byte") {
      p.tamper_at_byte = v;
    } else if (key == "tamper_chunks") {
      TERN_RETURN_IF_ERROR(u32(&p.tamper_chunks));
    } else if (key == "drop_after_bytes") {
      p.drop_after_bytes = v;
    } else if (key == "drop_connections") {
      TERN_RETURN_IF_ERROR(u32(&p.drop_connections));
    } else {
      return TERN_ERROR(kInvalidArgument,
                        "fault policy: unknown key '", key, "'");
    }
  }
  return p;
}

}  // namespace transport_internal

Result<std::unique_ptr<Transport>> NewTestFaultTransport(Transport& inner, std::string_view spec) {
  TERN_ASSIGN_OR_RETURN(FaultPolicy policy, transport_internal::ParseFaultPolicy(spec));
  return std::unique_ptr<Transport>(NewFaultTransport(inner, std::move(policy)));
}

}  // namespace tern
