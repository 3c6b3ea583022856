// `tern cast`: an FP32/BF16 checkpoint -> the serve view an engine loads, in
// one of the quantized layouts of docs/quantization.md.
#include <atomic>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "tern/thread_pool.h"
#include "tern/checkpoint.h"
#include "tern/float_cast.h"
#include "tern/quant_plan.h"
#include "tern/quantize.h"
#include "tools/cli_util.h"
#include "tools/flags.h"

namespace tern::cli {
namespace {

namespace fs = std::filesystem;

struct Plan {
  const TensorDesc* in = nullptr;
  QuantTensorPlan q;
};

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Result<std::vector<float>> ToF32(const TensorRef& t) {
  const uint64_t n = t.desc->elements();
  std::vector<float> out(n);
  switch (t.desc->dtype) {
    case DType::kF32:
      std::memcpy(out.data(), t.data, n * 4);
      break;
    case DType::kBF16:
      CastBF16ToF32(reinterpret_cast<const uint16_t*>(t.data), out.data(), n);
      break;
    case DType::kF16:
      CastF16ToF32(reinterpret_cast<const uint16_t*>(t.data), out.data(), n);
      break;
    default:
      return TERN_ERROR(kInvalidArgument, t.desc->name, ": cannot cast ", DTypeName(t.desc->dtype));
  }
  return out;
}

// Copies config.json with the quantization_config added (textually after the
// opening brace; a config that already has one is refused).
Result<std::string> ConfigWithQuantization(const std::string& path, const std::string& qconfig) {
  std::ifstream f(path, std::ios::binary);
  TERN_REQUIRE(f, kIo, "cannot read ", path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (qconfig.empty()) return text;
  TERN_REQUIRE(text.find("\"quantization_config\"") == std::string::npos, kInvalidArgument, path,
               " already has a quantization_config; cast from the unquantized master");
  const size_t brace = text.find('{');
  TERN_REQUIRE(brace != std::string::npos, kCorrupt, path, " is not a JSON object");
  const bool empty = text.find_first_not_of(" \t\r\n", brace + 1) != std::string::npos &&
                     text[text.find_first_not_of(" \t\r\n", brace + 1)] == '}';
  text.insert(brace + 1, "\n  \"quantization_config\": " + qconfig + (empty ? "" : ","));
  return text;
}

Status Cast(const Flags& flags) {
  TERN_ASSIGN_OR_RETURN(QuantSpec spec, ParseQuantFormat(flags.Get("format")));
  ScalePolicy policy;
  const std::string policy_name = flags.Get("scale-policy");
  if (policy_name == "fresh") {
    policy.kind = ScalePolicy::Kind::kFresh;
  } else {
    TERN_REQUIRE(policy_name == "band", kInvalidArgument, "--scale-policy must be band or fresh");
  }
  TERN_REQUIRE(flags.positional().size() == 1, kInvalidArgument, "expected one input checkpoint");
  const std::string out_path = flags.Get("o");
  TERN_REQUIRE(!out_path.empty(), kInvalidArgument, "-o OUT is required");
  TERN_ASSIGN_OR_RETURN(auto in, Checkpoint::Open(flags.positional()[0]));
  std::unique_ptr<Checkpoint> prev;
  if (!flags.Get("previous").empty()) {
    TERN_ASSIGN_OR_RETURN(prev, Checkpoint::Open(flags.Get("previous")));
  }
  std::vector<std::string> keep = DefaultQuantKeep();
  for (const std::string& k : SplitCommas(flags.Get("keep"))) keep.push_back(k);

  // Plan every output tensor first: the checkpoint is created with its final
  // table.
  std::vector<Plan> plans;
  for (const TensorRef& t : in->view().tensors) {
    TERN_ASSIGN_OR_RETURN(QuantTensorPlan q, PlanQuantTensor(spec, *t.desc, keep));
    if (!q.note.empty())
      fprintf(stderr, "tern cast: keeping %s unquantized: %s\n", t.desc->name.c_str(), q.note.c_str());
    plans.push_back(Plan{t.desc, std::move(q)});
  }
  std::vector<TensorDesc> descs;
  for (const Plan& p : plans) descs.insert(descs.end(), p.q.outs.begin(), p.q.outs.end());
  SortLikeReferenceWriter(descs);
  CreateOptions create;
  create.overwrite = flags.Switch("overwrite");
  TERN_ASSIGN_OR_RETURN(auto out, WritableCheckpoint::Create(out_path, descs, {{"format", "pt"}}, create));

  TERN_ASSIGN_OR_RETURN(unsigned threads, ThreadsFrom(flags));
  ThreadPool pool(threads);
  std::mutex mu;
  Status first_error;
  std::atomic<uint64_t> rescaled{0}, groups{0};
  pool.ParallelFor(plans.size(), [&](uint64_t i) {
    const Plan& plan = plans[i];
    const QuantTensorPlan& p = plan.q;
    auto fail = [&](Status s) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = s.WithContext(plan.in->name);
    };
    const TensorRef* src = in->view().Find(plan.in->name);
    if (!p.quantize) {
      auto* dst = out->view().Find(p.outs[0].name);
      if (p.outs[0].dtype == plan.in->dtype) {
        std::memcpy(dst->data, src->data, plan.in->bytes());
        return;
      }
      auto f = ToF32(*src);
      if (!f.ok()) return fail(f.status());
      auto* o = reinterpret_cast<uint16_t*>(dst->data);
      if (p.outs[0].dtype == DType::kF16) {
        CastF32ToF16(f->data(), o, f->size());
      } else {
        CastF32ToBF16(f->data(), o, f->size());
      }
      return;
    }
    auto master = ToF32(*src);
    if (!master.ok()) return fail(master.status());
    Quantized previous;
    if (prev) {
      for (const TensorDesc& od : p.outs) {
        const TensorRef* pt = prev->view().Find(od.name);
        if (pt == nullptr || !pt->desc->SameLayout(od)) {
          return fail(TERN_ERROR(kMismatch, "--previous has no tensor ", od.name, " of the same layout"));
        }
        previous.tensors.push_back({od.name.substr(p.prefix.size()), od.dtype, od.shape,
                                    std::vector<uint8_t>(pt->data, pt->data + od.bytes())});
      }
    }
    auto q = Quantize(spec, master->data(), plan.in->shape, prev ? &previous : nullptr, policy);
    if (!q.ok()) return fail(q.status());
    rescaled += q->rescaled_groups;
    groups += q->scale_groups;
    for (const QuantTensor& qt : q->tensors) {
      auto* dst = out->view().Find(p.prefix + qt.suffix);
      std::memcpy(dst->data, qt.data.data(), qt.data.size());
    }
  });
  TERN_RETURN_IF_ERROR(first_error);

  const std::string qconfig = QuantizationConfigJson(spec);
  const fs::path in_dir = fs::is_directory(flags.positional()[0]) ? fs::path(flags.positional()[0])
                                                                  : fs::path();
  if (!EndsWith(out_path, ".safetensors")) {
    if (!in_dir.empty() && fs::exists(in_dir / "config.json")) {
      TERN_ASSIGN_OR_RETURN(std::string cfg, ConfigWithQuantization(in_dir / "config.json", qconfig));
      TERN_RETURN_IF_ERROR(out->AddFile(
          "config.json", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(cfg.data()), cfg.size())));
    } else if (!qconfig.empty()) {
      const std::string cfg = "{\n  \"quantization_config\": " + qconfig + "\n}\n";
      TERN_RETURN_IF_ERROR(out->AddFile(
          "config.json", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(cfg.data()), cfg.size())));
    }
  }
  TERN_RETURN_IF_ERROR(out->Commit());
  printf("cast %s -> %s (%s): %zu tensors, %llu of %llu scale groups re-scaled\n",
         flags.positional()[0].c_str(), out_path.c_str(), spec.name.c_str(), descs.size(),
         static_cast<unsigned long long>(rescaled.load()), static_cast<unsigned long long>(groups.load()));
  return Status::Ok();
}

}  // namespace

int RunCast(int argc, char** argv) {
  Flags flags("cast", "quantize an FP32/BF16 checkpoint into a serve layout");
  std::string formats;
  for (const std::string& n : QuantFormatNames()) formats += (formats.empty() ? "" : "|") + n;
  flags.Add("format", formats, "", true);
  flags.Add("o", "output: a .safetensors file or a directory", "", true);
  flags.Add("scale-policy", "band (keep scales within a band of --previous: sparse patches) or fresh", "band");
  flags.Add("previous", "the previous step's output, whose scales band may keep");
  flags.Add("keep", "extra comma-separated name substrings to leave unquantized (always: "
                    "norm, embed, lm_head, mlp.gate.weight, router)");
  flags.AddSwitch("overwrite", "replace OUT if it exists");
  flags.AddPositional("IN", "an FP32 or BF16 checkpoint (file or directory)");
  AddThreadsFlag(flags);
  flags.SetEpilog("Layouts, rounding and the scale policy: docs/quantization.md.");
  Status st = flags.Parse(argc, argv);
  if (!st.ok()) return Report("cast", st);
  return Report("cast", Cast(flags));
}

}  // namespace tern::cli
