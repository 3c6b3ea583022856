// Run-time probe of UCX: can a context be made, and which transports and
// memory types does this UCX build and machine offer?
#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tern/transport_probe.h"

namespace tern {

BackendProbe ProbeUcx() {
  BackendProbe probe{"ucx", false, ""};
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  const std::string version =
      std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
    probe.detail = "libucp " + version + ": cannot read configuration";
    return probe;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
  ucp_context_h context = nullptr;
  const ucs_status_t st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    probe.detail = "libucp " + version + ": ucp_init failed: " + ucs_status_string(st);
    return probe;
  }
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  std::string memory = "host";
  if (ucp_context_query(context, &attr) == UCS_OK) {
    if (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) memory += ",cuda";
    if (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_ROCM)) memory += ",rocm";
  }
  // The transports UCX found (one "# Transport: x" line per device).
  std::string transports;
  char* text = nullptr;
  size_t text_bytes = 0;
  if (FILE* out = open_memstream(&text, &text_bytes)) {
    ucp_context_print_info(context, out);
    std::fclose(out);
    std::string info(text, text_bytes);
    std::free(text);
    // "#      resource 2  :  md 1  dev 2  flags -- tcp/lo"
    for (size_t at = info.find("flags -- "); at != std::string::npos;
         at = info.find("flags -- ", at + 1)) {
      const size_t start = at + 9, end = info.find('\n', start);
      if (!transports.empty()) transports += ' ';
      transports += info.substr(start, end == std::string::npos ? end : end - start);
    }
  }
  ucp_cleanup(context);
  probe.available = true;
  probe.detail = "libucp " + version + ", transports " + (transports.empty() ? "?" : transports) +
                 ", memory types " + memory;
  return probe;
}

}  // namespace tern
