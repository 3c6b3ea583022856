// tern inspect: what a patch holds, per tensor and in total, as a table or
// JSON. Validates the whole patch (every checksum and stream) on the way.
#include <cstdio>
#include <string>

#include "tern/patch.h"
#include "tools/cli_util.h"
#include "tools/flags.h"

namespace tern::cli {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

void PrintJson(const PatchInfo& info) {
  std::printf("{\n  \"format_version\": %u,\n", info.format_version);
  std::printf("  \"base_version\": %llu,\n  \"target_version\": %llu,\n",
              static_cast<unsigned long long>(info.base_version),
              static_cast<unsigned long long>(info.target_version));
  std::printf("  \"base_digest\": \"%s\",\n  \"target_digest\": \"%s\",\n",
              info.base_digest.ToString().c_str(), info.target_digest.ToString().c_str());
  std::printf("  \"patch_bytes\": %llu,\n  \"container_bytes\": %llu,\n",
              static_cast<unsigned long long>(info.patch_bytes),
              static_cast<unsigned long long>(info.container_bytes));
  std::printf("  \"elements\": %llu,\n  \"changed_elements\": %llu,\n  \"segments\": %llu,\n",
              static_cast<unsigned long long>(info.elements),
              static_cast<unsigned long long>(info.changed_elements),
              static_cast<unsigned long long>(info.segments));
  std::printf("  \"position_bytes\": %llu,\n  \"value_bytes\": %llu,\n  \"header_bytes\": %llu,\n",
              static_cast<unsigned long long>(info.position_bytes),
              static_cast<unsigned long long>(info.value_bytes),
              static_cast<unsigned long long>(info.header_bytes));
  std::printf("  \"bits_per_changed_element\": %.4f,\n  \"tensors\": [", info.bits_per_changed());
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    const TensorPatchInfo& t = info.tensors[i];
    std::printf(
        "%s\n    {\"name\": %s, \"dtype\": \"%s\", \"shape\": %s, \"elements\": %llu, "
        "\"changed_elements\": %llu, \"segments\": %llu, \"sparse_segments\": %llu, "
        "\"dense_segments\": %llu, \"raw_segments\": %llu, \"position_bytes\": %llu, "
        "\"value_bytes\": %llu, \"header_bytes\": %llu, \"bits_per_changed_element\": %.4f}",
        i ? "," : "", JsonString(t.name).c_str(), std::string(DTypeName(t.dtype)).c_str(),
        ShapeString(t.shape).c_str(), static_cast<unsigned long long>(t.elements),
        static_cast<unsigned long long>(t.changed_elements),
        static_cast<unsigned long long>(t.segments),
        static_cast<unsigned long long>(t.sparse_segments),
        static_cast<unsigned long long>(t.dense_segments),
        static_cast<unsigned long long>(t.raw_segments),
        static_cast<unsigned long long>(t.position_bytes),
        static_cast<unsigned long long>(t.value_bytes),
        static_cast<unsigned long long>(t.header_bytes), t.bits_per_changed());
  }
  std::printf("\n  ]\n}\n");
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
                std::string(DTypeName(t.dtype)).c_str(),
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

int RunInspect(int argc, char** argv) {
  Flags flags("inspect",
              "Show a patch's versions, base/target digests and, per tensor and in total, "
              "elements, changed elements, bytes per stream and bits per changed element. "
              "Validates every checksum and stream.");
  flags.AddPositional("PATCH", "a patch file");
  flags.AddSwitch("json", "print JSON instead of a table");
  flags.AddSwitch("all", "also list unchanged tensors in the table");
  Status s = flags.Parse(argc, argv);
  if (s.ok()) {
    auto run = [&]() -> Status {
      TERN_ASSIGN_OR_RETURN(auto file, MappedFile::Open(flags.positional()[0]));
      TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(file->bytes()));
      if (flags.Switch("json"))
        PrintJson(info);
      else
        PrintTable(info, flags.Switch("all"));
      return Status::Ok();
    };
    s = run();
  }
  return Report("inspect", s);
}

}  // namespace tern::cli
