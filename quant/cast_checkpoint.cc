#include "tern/cast_checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "quant/quantization_config.h"
#include "quant/quantize_internal.h"
#include "tern/checkpoint.h"
#include "tern/float_cast.h"
#include "tern/quant_plan.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

// A config.json is a few KB; this only bounds what a wrong path can cost.
constexpr uint64_t kConfigBytesMax = 16 << 20;

struct Plan {
  const TensorDesc* in = nullptr;
  QuantTensorPlan q;
};

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

Result<std::string> ReadConfig(const fs::path& path) {
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(path, ec);
  if (ec) return TERN_ERROR(kIo, "cannot read ", path.string(), ": ", ec.message());
  TERN_REQUIRE(bytes <= kConfigBytesMax, kInvalidArgument, path.string(), " is ", bytes,
               " bytes; a config.json over ", kConfigBytesMax, " bytes is not one");
  std::ifstream f(path, std::ios::binary);
  TERN_REQUIRE(f, kIo, "cannot read ", path.string());
  std::string text(bytes, '\0');
  f.read(text.data(), static_cast<std::streamsize>(bytes));
  TERN_REQUIRE(f.gcount() == static_cast<std::streamsize>(bytes), kIo, "short read of ",
               path.string());
  return text;
}

// The output's config.json, or "" for none (see the header's contract).
Result<std::string> OutputConfig(const std::string& in_path, const QuantSpec& spec,
                                 const std::vector<std::string>& unquantized) {
  const nlohmann::ordered_json qconfig = quant::QuantizationConfig(spec, unquantized);
  const fs::path config_path = fs::path(in_path) / "config.json";
  std::error_code ec;  // the non-throwing overloads: an error reads as "no config"
  const bool have_config = fs::is_directory(in_path, ec) && fs::exists(config_path, ec);
  if (!have_config) {
    if (qconfig.is_null()) return std::string();
    return nlohmann::ordered_json{{"quantization_config", qconfig}}.dump(2) + "\n";
  }
  TERN_ASSIGN_OR_RETURN(std::string text, ReadConfig(config_path));
  if (qconfig.is_null()) return text;
  // Parsed, not spliced: ordered_json keeps the keys' order and numbers
  // round-trip exactly (doubles print shortest, integers as written).
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return TERN_ERROR(kCorrupt, config_path.string(), " is not valid JSON: ", e.what());
  }
  TERN_REQUIRE(config.is_object(), kCorrupt, config_path.string(), " is not a JSON object");
  TERN_REQUIRE(!config.contains("quantization_config"), kInvalidArgument, config_path.string(),
               " already has a quantization_config; cast from the unquantized master");
  config["quantization_config"] = qconfig;
  try {
    // indent 2 and UTF-8 kept: how transformers' save_pretrained writes it.
    return config.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    return TERN_ERROR(kCorrupt, config_path.string(), ": ", e.what());
  }
}

// Modules whose 2-D float weight stays unquantized (a --keep match, or a
// shape the format cannot take), for the config's exclusion list: engines
// quantize every Linear a config does not exclude. Embeddings and lm_head
// are not quantized Linears in any engine's config (lm_head is listed
// always), norms are 1-D.
std::vector<std::string> UnquantizedLinears(const std::vector<Plan>& plans) {
  std::vector<std::string> modules;
  for (const Plan& p : plans) {
    const TensorDesc& d = *p.in;
    const bool floaty = d.dtype == DType::kF32 || d.dtype == DType::kBF16 || d.dtype == DType::kF16;
    if (p.q.quantize || !floaty || d.shape.size() != 2 || !EndsWith(d.name, ".weight")) continue;
    const std::string module = d.name.substr(0, d.name.size() - 7);
    if (module.find("embed") != std::string::npos || module == "lm_head" ||
        EndsWith(module, ".lm_head"))
      continue;
    modules.push_back(module);
  }
  return modules;
}

const char* TensorScaleSuffix(const QuantSpec& spec) {
  switch (spec.scheme) {
    case QuantScheme::kNvfp4:
      return ".weight_scale_2";
    case QuantScheme::kNvfp4Ct:
      return ".weight_global_scale";
    default:
      return ".weight_scale";
  }
}

// For formats with a per-tensor scale: one scale per fused layer (q/k/v,
// gate/up; FusedLayerKey), from the largest |x| over its parts and, with a
// previous step, the parts' previous scale when they all stored the same one
// (a previous cast that did not share re-derives it). shared[i] is set for
// every plan that is part of a fused layer.
Status ShareTensorScales(const QuantSpec& spec, const ScalePolicy& policy, const Checkpoint& in,
                         const Checkpoint* prev, const std::vector<Plan>& plans, ThreadPool& pool,
                         std::vector<std::optional<float>>* shared) {
  std::map<std::string, std::vector<size_t>> layers;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i].q.quantize) continue;
    const std::string key = FusedLayerKey(plans[i].in->name);
    if (!key.empty()) layers[key].push_back(i);
  }
  std::vector<size_t> parts;
  for (const auto& [key, members] : layers) parts.insert(parts.end(), members.begin(), members.end());
  std::vector<float> amax(plans.size(), 0.0f);
  std::mutex mu;
  Status first_error;
  pool.ParallelFor(parts.size(), [&](uint64_t k) {
    const Plan& plan = plans[parts[k]];
    auto f = ToF32(*in.view().Find(plan.in->name));
    if (!f.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = f.status();
      return;
    }
    amax[parts[k]] = quant::AbsMax(f->data(), f->size());
  });
  TERN_RETURN_IF_ERROR(first_error);
  for (const auto& [key, members] : layers) {
    float layer_amax = 0.0f;
    std::optional<uint32_t> prev_bits;
    bool prev_shared = prev != nullptr;
    for (size_t i : members) {
      layer_amax = std::max(layer_amax, amax[i]);
      const TensorRef* t =
          prev ? prev->view().Find(plans[i].q.prefix + TensorScaleSuffix(spec)) : nullptr;
      if (t == nullptr || t->desc->dtype != DType::kF32 || t->desc->elements() != 1) {
        prev_shared = false;
        continue;
      }
      uint32_t bits;
      std::memcpy(&bits, t->data, 4);
      if (prev_bits && *prev_bits != bits) prev_shared = false;
      prev_bits = bits;
    }
    float previous = 0.0f;
    if (prev_shared) std::memcpy(&previous, &*prev_bits, 4);
    const float scale = TensorScale(spec, layer_amax, prev_shared ? &previous : nullptr, policy);
    for (size_t i : members) (*shared)[i] = scale;
  }
  return Status::Ok();
}

}  // namespace

Result<CastReport> CastCheckpoint(const std::string& in_path, const std::string& out_path,
                                  const CastOptions& options, ThreadPool& pool) {
  const QuantSpec& spec = options.spec;
  TERN_ASSIGN_OR_RETURN(auto in, Checkpoint::Open(in_path));
  std::unique_ptr<Checkpoint> prev;
  if (!options.previous_path.empty()) {
    TERN_ASSIGN_OR_RETURN(prev, Checkpoint::Open(options.previous_path));
  }
  std::vector<std::string> keep = DefaultQuantKeep();
  keep.insert(keep.end(), options.keep.begin(), options.keep.end());
  // Before any tensor work: a config that cannot be written fails fast.
  const bool directory_out = !EndsWith(out_path, ".safetensors");
  std::string config;
  if (directory_out) {
    TERN_ASSIGN_OR_RETURN(config, OutputConfig(in_path, spec, {}));
  }

  // Plan every output tensor first: the checkpoint is created with its final
  // table.
  CastReport report;
  std::vector<Plan> plans;
  for (const TensorRef& t : in->view().tensors) {
    TERN_ASSIGN_OR_RETURN(QuantTensorPlan q, PlanQuantTensor(spec, *t.desc, keep));
    if (!q.note.empty()) report.kept_unquantized.emplace_back(t.desc->name, q.note);
    plans.push_back(Plan{t.desc, std::move(q)});
  }
  if (directory_out) {
    TERN_ASSIGN_OR_RETURN(config, OutputConfig(in_path, spec, UnquantizedLinears(plans)));
  }
  std::vector<std::optional<float>> shared_scale(plans.size());
  if (HasTensorScale(spec)) {
    TERN_RETURN_IF_ERROR(
        ShareTensorScales(spec, options.policy, *in, prev.get(), plans, pool, &shared_scale));
  }
  std::vector<TensorDesc> descs;
  for (const Plan& p : plans) descs.insert(descs.end(), p.q.outs.begin(), p.q.outs.end());
  SortLikeReferenceWriter(descs);
  report.tensors = descs.size();
  CreateOptions create;
  create.overwrite = options.overwrite;
  TERN_ASSIGN_OR_RETURN(auto out,
                        WritableCheckpoint::Create(out_path, descs, {{"format", "pt"}}, create));

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
          return fail(TERN_ERROR(kMismatch, "the previous checkpoint has no tensor ", od.name,
                                 " of the same layout"));
        }
        previous.tensors.push_back({od.name.substr(p.prefix.size()), od.dtype, od.shape,
                                    std::vector<uint8_t>(pt->data, pt->data + od.bytes())});
      }
    }
    const std::optional<float>& shared = shared_scale[i];
    auto q = Quantize(spec, master->data(), plan.in->shape, prev ? &previous : nullptr,
                      options.policy, shared ? &*shared : nullptr);
    if (!q.ok()) return fail(q.status());
    rescaled += q->rescaled_groups;
    groups += q->scale_groups;
    for (const QuantTensor& qt : q->tensors) {
      auto* dst = out->view().Find(p.prefix + qt.suffix);
      std::memcpy(dst->data, qt.data.data(), qt.data.size());
    }
  });
  TERN_RETURN_IF_ERROR(first_error);

  if (!config.empty()) {
    TERN_RETURN_IF_ERROR(out->AddFile(
        "config.json", {reinterpret_cast<const uint8_t*>(config.data()), config.size()}));
  }
  TERN_RETURN_IF_ERROR(out->Commit());
  report.rescaled_groups = rescaled.load();
  report.scale_groups = groups.load();
  return report;
}

}  // namespace tern
