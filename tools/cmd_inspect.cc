// tern inspect: what a patch holds, per tensor and in total, as a table or
// JSON. Validates the whole patch (every checksum and stream) on the way.
#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "tern/patch.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern::cli {
namespace {

// Four decimals, as the table prints it: a stable value for scripts.
double Rounded4(double x) { return std::round(x * 1e4) / 1e4; }

void PrintJson(const PatchInfo& info) {
  using nlohmann::ordered_json;
  ordered_json tensors = ordered_json::array();
  for (const TensorPatchInfo& t : info.tensors) {
    tensors.push_back({{"name", t.name},
                       {"dtype", DTypeName(t.dtype)},
                       {"shape", t.shape},
                       {"elements", t.elements},
                       {"changed_elements", t.changed_elements},
                       {"nibbles", t.nibbles},
                       {"segments", t.segments},
                       {"sparse_segments", t.sparse_segments},
                       {"dense_segments", t.dense_segments},
                       {"raw_segments", t.raw_segments},
                       {"position_bytes", t.position_bytes},
                       {"value_bytes", t.value_bytes},
                       {"header_bytes", t.header_bytes},
                       {"bits_per_changed_element", Rounded4(t.bits_per_changed())}});
  }
  const ordered_json out = {{"format_version", info.format_version},
                            {"base_version", info.base_version},
                            {"target_version", info.target_version},
                            {"base_digest", info.base_digest.ToString()},
                            {"target_digest", info.target_digest.ToString()},
                            {"patch_bytes", info.patch_bytes},
                            {"container_bytes", info.container_bytes},
                            {"elements", info.elements},
                            {"changed_elements", info.changed_elements},
                            {"segments", info.segments},
                            {"position_bytes", info.position_bytes},
                            {"value_bytes", info.value_bytes},
                            {"header_bytes", info.header_bytes},
                            {"bits_per_changed_element", Rounded4(info.bits_per_changed())},
                            {"tensors", std::move(tensors)}};
  // Tensor names come from a validated patch but need not be UTF-8: replace
  // bad bytes rather than throw.
  std::printf("%s\n", out.dump(2, ' ', false, ordered_json::error_handler_t::replace).c_str());
}

void PrintTable(const PatchInfo& info, bool all) {
  std::printf("tern patch format %u: v%llu -> v%llu, %s\n", info.format_version,
              static_cast<unsigned long long>(info.base_version),
              static_cast<unsigned long long>(info.target_version),
              HumanBytes(info.patch_bytes).c_str());
  std::printf("  base   %s\n  target %s\n\n", info.base_digest.ToString().c_str(),
              info.target_digest.ToString().c_str());
  std::printf("%-52s %-8s %14s %12s %8s %11s %11s %9s %8s\n", "tensor", "dtype", "elements",
              "changed", "%", "pos bytes", "val bytes", "hdr bytes", "bits/chg");
  size_t hidden = 0;
  for (const TensorPatchInfo& t : info.tensors) {
    if (!all && t.changed_elements == 0) {
      ++hidden;
      continue;
    }
    std::string name = t.name.size() > 52 ? "..." + t.name.substr(t.name.size() - 49) : t.name;
    std::printf("%-52s %-8s %14llu %12llu %8.4f %11llu %11llu %9llu %8.2f\n", name.c_str(),
                (std::string(DTypeName(t.dtype)) + (t.nibbles ? "/nib" : "")).c_str(),
                static_cast<unsigned long long>(t.elements),
                static_cast<unsigned long long>(t.changed_elements),
                t.elements ? 100.0 * t.changed_elements / t.elements : 0.0,
                static_cast<unsigned long long>(t.position_bytes),
                static_cast<unsigned long long>(t.value_bytes),
                static_cast<unsigned long long>(t.header_bytes), t.bits_per_changed());
  }
  std::printf("%-52s %-8s %14llu %12llu %8.4f %11llu %11llu %9llu %8.2f\n", "TOTAL", "",
              static_cast<unsigned long long>(info.elements),
              static_cast<unsigned long long>(info.changed_elements),
              info.elements ? 100.0 * info.changed_elements / info.elements : 0.0,
              static_cast<unsigned long long>(info.position_bytes),
              static_cast<unsigned long long>(info.value_bytes),
              static_cast<unsigned long long>(info.header_bytes + info.container_bytes),
              info.bits_per_changed());
  if (hidden) std::printf("(%zu unchanged tensors not shown; --all shows them)\n", hidden);
}

}  // namespace

void AddInspect(CLI::App& tern, Dispatch& dispatch) {
  struct Args {
    std::string path;
    bool json = false, all = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = tern.add_subcommand("inspect", "show what a patch holds");
  cmd->footer(
      "Shows a patch's versions, base/target digests and, per tensor and in total, elements, "
      "changed elements, bytes per stream and bits per changed element. Validates every "
      "checksum and stream.");
  cmd->add_option("PATCH", a->path, "a patch file")->required();
  cmd->add_flag("--json", a->json, "print JSON instead of a table");
  cmd->add_flag("--all", a->all, "also list unchanged tensors in the table");
  dispatch.On(cmd, {nullptr, [a]() -> Status {
                      TERN_ASSIGN_OR_RETURN(auto file, MapReadOnly(a->path));
                      TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(file->bytes()));
                      if (a->json)
                        PrintJson(info);
                      else
                        PrintTable(info, a->all);
                      return Status::Ok();
                    }});
}

}  // namespace tern::cli
