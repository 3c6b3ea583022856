// TraceGenerator: FP32 master weights under Adam on synthetic gradients (the
// master trajectory), cast tile by tile into the serve view (the serve cast),
// counting the elements whose bits changed as the old view is overwritten.
//
// Determinism rests on three things: every random number is a pure function
// of (seed, tensor name, stream, step, element index); work is split into
// fixed blocks whose results never depend on which thread ran them; and the
// arithmetic is IEEE basic operations only (no libm, no FMA contraction: the
// target builds with -ffp-contract=off).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "tern/thread_pool.h"
#include "tern/float_cast.h"
#include "tern/quant_plan.h"
#include "datagen/model_config.h"
#include "tern/datagen.h"

namespace tern {

namespace {

// Work unit of a parallel pass; fixed, so results do not depend on threads.
constexpr uint64_t kBlockElements = uint64_t{1} << 16;
// Master elements updated before their tile is cast and compared: small
// enough for the tile and its cast to stay in L1.
constexpr uint64_t kTileElements = 2048;

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

// splitmix64's finalizer: a bijective 64-bit mix with full avalanche.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Counter-based draws: element e of a stream is Mix64 of a point on the
// splitmix64 sequence that starts at the stream's key.
inline uint64_t Draw(uint64_t key, uint64_t e) { return Mix64(key + (e + 1) * kGamma); }

enum Stream : uint64_t { kInitStream = 1, kDirectionStream = 2, kNoiseStream = 3, kScaleStream = 4 };

uint64_t StreamKey(uint64_t seed, uint64_t name_hash, Stream stream, uint64_t step) {
  return Mix64(Mix64(Mix64(seed + kGamma * stream) ^ name_hash) + step * kGamma);
}

uint64_t HashName(std::string_view name) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Approximate standard normals as Irwin-Hall sums of 16-bit uniforms: exact
// integer sums and one rounding, so bit-identical everywhere (tails are cut
// at ±3.5σ for four terms, ±4.9σ for eight, which a simulation can afford).
inline float Normal4(uint64_t r) {
  constexpr float kScale = 1.7320508075688772f / 65536.0f;  // sqrt(12 / 4) / 2^16
  const int32_t sum = static_cast<int32_t>(r & 0xffff) + static_cast<int32_t>((r >> 16) & 0xffff) +
                      static_cast<int32_t>((r >> 32) & 0xffff) + static_cast<int32_t>(r >> 48);
  return static_cast<float>(sum - 131070) * kScale;
}

inline float Normal8(uint64_t a, uint64_t b) {
  constexpr float kScale = 1.2247448713915890f / 65536.0f;  // sqrt(12 / 8) / 2^16
  auto sum4 = [](uint64_t r) {
    return static_cast<int32_t>(r & 0xffff) + static_cast<int32_t>((r >> 16) & 0xffff) +
           static_cast<int32_t>((r >> 32) & 0xffff) + static_cast<int32_t>(r >> 48);
  };
  return static_cast<float>(sum4(a) + sum4(b) - 262140) * kScale;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The serve-view half. Every format maps a tile of master floats to view
// bytes; quantized formats (with per-group scales) cast whole tensors at
// once instead (Impl::ServeQuantized).
void CastTile(ServeFormat format, const float* in, uint16_t* out, uint64_t n) {
  switch (format) {
    case ServeFormat::kBF16:
      CastF32ToBF16(in, out, n);
      return;
    case ServeFormat::kF16:
      CastF32ToF16(in, out, n);
      return;
    case ServeFormat::kQuantized:
      break;  // whole tensors at once: Impl::ServeQuantized
  }
  TERN_ASSERT(false, "unhandled serve format");
}

template <class T>
std::unique_ptr<T[]> Allocate(uint64_t n) {
  return std::unique_ptr<T[]>(new (std::nothrow) T[n]);
}

}  // namespace

Status TraceConfig::Validate() const {
  const TraceConfig& c = *this;
  TERN_RETURN_IF_ERROR(c.shape.Validate());
  const AdamConfig& a = c.adam;
  TERN_REQUIRE(std::isfinite(a.lr) && a.lr > 0 && a.lr < 1, kInvalidArgument,
               "learning rate ", a.lr, " outside (0, 1)");
  TERN_REQUIRE(a.beta1 >= 0 && a.beta1 < 1, kInvalidArgument, "beta1 ", a.beta1,
               " outside [0, 1)");
  TERN_REQUIRE(a.beta2 >= 0 && a.beta2 < 1, kInvalidArgument, "beta2 ", a.beta2,
               " outside [0, 1)");
  // eps must survive the cast to float: with eps 0 a zero gradient gives 0/0.
  TERN_REQUIRE(std::isfinite(a.eps) && a.eps >= 1e-30 && a.eps <= 1, kInvalidArgument, "eps ",
               a.eps, " outside [1e-30, 1]");
  TERN_REQUIRE(std::isfinite(a.weight_decay) && a.weight_decay >= 0 && a.lr * a.weight_decay < 1,
               kInvalidArgument, "weight decay ", a.weight_decay, " must be >= 0 with lr*wd < 1");
  TERN_REQUIRE(std::isfinite(c.signal_to_noise) && c.signal_to_noise >= 0 &&
                   c.signal_to_noise <= 1e6,
               kInvalidArgument, "signal_to_noise ", c.signal_to_noise, " outside [0, 1e6]");
  if (c.format == ServeFormat::kQuantized) {
    TERN_REQUIRE(c.quant.scheme != QuantScheme::kBF16 && c.quant.scheme != QuantScheme::kF16,
                 kInvalidArgument, "quantized serve format needs a quantized scheme, not ",
                 c.quant.name, " (use ServeFormat::kBF16 / kF16)");
    const ScalePolicy& p = c.scale_policy;
    TERN_REQUIRE(p.band_low > 0 && p.band_low <= 1 && p.headroom >= 1 && p.headroom <= 2,
                 kInvalidArgument, "scale policy band ", p.band_low, " / headroom ", p.headroom,
                 " outside (0, 1] / [1, 2]");
  }
  return Status::Ok();
}

struct TraceGenerator::Impl {
  struct Tensor {
    uint64_t offset = 0;  // first element in the flat arrays
    uint64_t elements = 0;
    uint64_t name_hash = 0;
    float init_mean = 0;
    float init_std = 0;
    float grad_scale = 0;
  };
  struct Block {
    uint32_t tensor;  // < number of tensors, which Validate bounds far below 2^32
    uint64_t begin;   // element range inside the tensor
    uint64_t end;
  };

  TraceConfig config;
  ThreadPool* pool = nullptr;
  std::vector<TensorDesc> descs;  // sorted by name; view_.tensors point here
  std::vector<Tensor> tensors;
  std::vector<Block> blocks;
  uint64_t elements = 0;
  std::unique_ptr<float[]> master;
  std::unique_ptr<float[]> moment1;
  std::unique_ptr<float[]> moment2;
  std::unique_ptr<uint16_t[]> view_bits;
  ServeView view;
  StepStats stats;
  uint64_t step = 0;
  double beta1_power = 1;  // beta^t by repeated products: exact and libm-free
  double beta2_power = 1;

  // kQuantized: what each master tensor serves as (descs order), its last
  // output (codes and scales, or a BF16 cast for kept tensors), and where
  // each view tensor lives in it.
  bool quantized = false;
  std::vector<QuantTensorPlan> plans;
  std::vector<Quantized> served;
  std::vector<TensorDesc> out_descs;  // sorted by name
  std::vector<std::pair<uint32_t, uint32_t>> out_source;  // (tensor, QuantTensor) per out_descs

  Status Init();
  Status Advance();
  Status PlanQuantized();
  // Re-serves every tensor from the master; counts changes when `count`.
  Status ServeQuantized(bool count);
  // Casts master elements [begin, end) of t into the view; returns how many
  // view elements changed (all of them when !count).
  uint64_t CastRange(const Tensor& t, uint64_t begin, uint64_t end, bool count);
  void Tally(const std::vector<uint64_t>& block_changed);
};

uint64_t TraceGenerator::Impl::CastRange(const Tensor& t, uint64_t begin, uint64_t end,
                                         bool count) {
  if (quantized) return 0;  // served per tensor after the master pass
  uint16_t tile[kTileElements];
  uint64_t changed = 0;
  for (uint64_t i = begin; i < end; i += kTileElements) {
    const uint64_t n = std::min(kTileElements, end - i);
    uint16_t* dst = view_bits.get() + t.offset + i;
    CastTile(config.format, master.get() + t.offset + i, tile, n);
    if (count)
      for (uint64_t j = 0; j < n; ++j) changed += tile[j] != dst[j];
    std::memcpy(dst, tile, n * sizeof(uint16_t));
  }
  return count ? changed : end - begin;
}

void TraceGenerator::Impl::Tally(const std::vector<uint64_t>& block_changed) {
  stats.step = step;
  stats.elements = elements;
  stats.changed = 0;
  stats.changed_per_tensor.assign(tensors.size(), 0);
  for (size_t i = 0; i < blocks.size(); ++i) {
    stats.changed_per_tensor[blocks[i].tensor] += block_changed[i];
    stats.changed += block_changed[i];
  }
}

Status TraceGenerator::Impl::PlanQuantized() {
  const std::vector<std::string> keep = DefaultQuantKeep();
  std::vector<std::tuple<std::string, uint32_t, uint32_t>> outs;
  for (size_t i = 0; i < descs.size(); ++i) {
    TensorDesc master_desc = descs[i];
    master_desc.dtype = DType::kF32;
    TERN_ASSIGN_OR_RETURN(QuantTensorPlan plan, PlanQuantTensor(config.quant, master_desc, keep));
    Quantized q;
    for (size_t j = 0; j < plan.outs.size(); ++j) {
      const TensorDesc& o = plan.outs[j];
      q.tensors.push_back({o.name.substr(plan.prefix.size()), o.dtype, o.shape,
                           std::vector<uint8_t>(o.bytes())});
      outs.emplace_back(o.name, static_cast<uint32_t>(i), static_cast<uint32_t>(j));
    }
    plans.push_back(std::move(plan));
    served.push_back(std::move(q));
  }
  std::sort(outs.begin(), outs.end());
  for (const auto& [name, i, j] : outs) {
    TERN_REQUIRE(out_descs.empty() || out_descs.back().name != name, kInternal,
                 "two serve tensors named ", name);
    out_descs.push_back(plans[i].outs[j]);
    out_source.emplace_back(i, j);
  }
  return Status::Ok();
}

Status TraceGenerator::Impl::ServeQuantized(bool count) {
  std::vector<Status> errors(tensors.size());
  std::vector<uint64_t> rescaled(tensors.size()), groups(tensors.size());
  // Per (tensor, output) changed elements, summed into view order below.
  std::vector<std::vector<uint64_t>> changed(tensors.size());
  pool->ParallelFor(tensors.size(), [&](uint64_t i) {
    const Tensor& t = tensors[i];
    const float* w = master.get() + t.offset;
    Quantized next;
    if (plans[i].quantize) {
      const Quantized* previous = step == 0 ? nullptr : &served[i];
      auto q = Quantize(config.quant, w, descs[i].shape, previous, config.scale_policy);
      if (!q.ok()) {
        errors[i] = q.status().WithContext(descs[i].name);
        return;
      }
      next = std::move(q).value();
    } else {
      const TensorDesc& o = plans[i].outs[0];
      QuantTensor qt{"", o.dtype, o.shape, std::vector<uint8_t>(o.bytes())};
      auto* bits = reinterpret_cast<uint16_t*>(qt.data.data());
      if (o.dtype == DType::kF16) {
        CastF32ToF16(w, bits, t.elements);
      } else {
        CastF32ToBF16(w, bits, t.elements);
      }
      next.tensors.push_back(std::move(qt));
    }
    Quantized& prev = served[i];
    if (next.tensors.size() != prev.tensors.size()) {
      errors[i] = TERN_ERROR(kInternal, descs[i].name, ": quantizer changed the layout");
      return;
    }
    changed[i].assign(next.tensors.size(), 0);
    for (size_t j = 0; j < next.tensors.size(); ++j) {
      const QuantTensor& a = prev.tensors[j];
      const QuantTensor& b = next.tensors[j];
      const TensorDesc& o = plans[i].outs[j];
      if (b.dtype != o.dtype || b.shape != o.shape || b.data.size() != a.data.size()) {
        errors[i] = TERN_ERROR(kInternal, o.name, ": quantizer changed the layout");
        return;
      }
      const uint64_t elements = o.elements();
      if (!count || elements == 0) {
        changed[i][j] = elements;
        continue;
      }
      const uint64_t width = b.data.size() / elements;  // whole bytes per element
      uint64_t n = 0;
      for (uint64_t e = 0; e < elements; ++e)
        n += std::memcmp(a.data.data() + e * width, b.data.data() + e * width, width) != 0;
      changed[i][j] = n;
    }
    rescaled[i] = next.rescaled_groups;
    groups[i] = next.scale_groups;
    prev = std::move(next);
  });
  for (const Status& s : errors) TERN_RETURN_IF_ERROR(s);
  stats.step = step;
  stats.elements = 0;
  stats.changed = 0;
  stats.rescaled_groups = 0;
  stats.scale_groups = 0;
  stats.changed_per_tensor.assign(out_descs.size(), 0);
  view.tensors.clear();
  for (size_t k = 0; k < out_descs.size(); ++k) {
    const auto [i, j] = out_source[k];
    stats.changed_per_tensor[k] = changed[i][j];
    stats.changed += changed[i][j];
    stats.elements += out_descs[k].elements();
    view.tensors.push_back(TensorRef{&out_descs[k], served[i].tensors[j].data.data()});
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    stats.rescaled_groups += rescaled[i];
    stats.scale_groups += groups[i];
  }
  return Status::Ok();
}

Status TraceGenerator::Impl::Init() {
  std::vector<uint64_t> block_changed(blocks.size());
  pool->ParallelFor(blocks.size(), [&](uint64_t bi) {
    const Block& b = blocks[bi];
    const Tensor& t = tensors[b.tensor];
    const uint64_t key = StreamKey(config.seed, t.name_hash, kInitStream, 0);
    float* w = master.get() + t.offset;
    for (uint64_t e = b.begin; e < b.end; ++e)
      w[e] = t.init_mean + t.init_std * Normal8(Draw(key, 2 * e), Draw(key, 2 * e + 1));
    std::fill(moment1.get() + t.offset + b.begin, moment1.get() + t.offset + b.end, 0.0f);
    std::fill(moment2.get() + t.offset + b.begin, moment2.get() + t.offset + b.end, 0.0f);
    block_changed[bi] = CastRange(t, b.begin, b.end, /*count=*/false);
  });
  if (quantized) return ServeQuantized(/*count=*/false);
  Tally(block_changed);
  return Status::Ok();
}

Status TraceGenerator::Impl::Advance() {
  ++step;
  const AdamConfig& a = config.adam;
  beta1_power *= a.beta1;
  beta2_power *= a.beta2;
  // PyTorch's Adam(W), in FP32 per element with the scalars prepared in double.
  const float beta1 = static_cast<float>(a.beta1);
  const float beta2 = static_cast<float>(a.beta2);
  const float one_minus_beta1 = static_cast<float>(1 - a.beta1);
  const float one_minus_beta2 = static_cast<float>(1 - a.beta2);
  const float step_size = static_cast<float>(a.lr / (1 - beta1_power));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - beta2_power));
  const float eps = static_cast<float>(a.eps);
  const float decay = static_cast<float>(1 - a.lr * a.weight_decay);
  const bool decoupled_decay = a.weight_decay > 0;
  const float snr = static_cast<float>(config.signal_to_noise);

  std::vector<uint64_t> block_changed(blocks.size());
  pool->ParallelFor(blocks.size(), [&](uint64_t bi) {
    const Block& b = blocks[bi];
    const Tensor& t = tensors[b.tensor];
    const uint64_t direction_key = StreamKey(config.seed, t.name_hash, kDirectionStream, 0);
    const uint64_t noise_key = StreamKey(config.seed, t.name_hash, kNoiseStream, step);
    const float signal_scale = t.grad_scale * snr;
    // Three simple loops per tile (draw gradients, Adam, cast) so each one
    // vectorizes; the tile stays in L1 between them.
    float grad[kTileElements];
    uint64_t changed = 0;
    for (uint64_t i = b.begin; i < b.end; i += kTileElements) {
      const uint64_t n = std::min(kTileElements, b.end - i);
      for (uint64_t j = 0; j < n; ++j)
        grad[j] = signal_scale * Normal4(Draw(direction_key, i + j)) +
                  t.grad_scale * Normal4(Draw(noise_key, i + j));
      float* __restrict w = master.get() + t.offset + i;
      float* __restrict m = moment1.get() + t.offset + i;
      float* __restrict v = moment2.get() + t.offset + i;
      if (decoupled_decay)
        for (uint64_t j = 0; j < n; ++j) w[j] = w[j] * decay;
      for (uint64_t j = 0; j < n; ++j) {
        const float g = grad[j];
        m[j] = beta1 * m[j] + one_minus_beta1 * g;
        v[j] = beta2 * v[j] + one_minus_beta2 * (g * g);
        const float denom = std::sqrt(v[j]) / bias_correction2_sqrt + eps;
        w[j] = w[j] + -step_size * (m[j] / denom);
      }
      changed += CastRange(t, i, i + n, /*count=*/true);
    }
    block_changed[bi] = changed;
  });
  if (quantized) return ServeQuantized(/*count=*/true);
  Tally(block_changed);
  return Status::Ok();
}

TraceGenerator::TraceGenerator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceGenerator::~TraceGenerator() = default;

uint64_t TraceGenerator::MemoryBytesFor(const ModelShape& shape, ServeFormat format) {
  const uint64_t n = shape.parameters();
  // Quantized layouts are at most BF16-sized plus small scale tensors; the
  // quantizer's working copies are per tensor.
  const uint64_t view_bytes = format == ServeFormat::kQuantized
                                  ? DTypeBytes(DType::kBF16, n) + n / 8
                                  : DTypeBytes(ServeDType(format), n);
  return 3 * n * sizeof(float) + view_bytes;
}

Result<std::unique_ptr<TraceGenerator>> TraceGenerator::Create(const TraceConfig& config,
                                                               ThreadPool& pool) {
  TERN_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->pool = &pool;
  impl->quantized = config.format == ServeFormat::kQuantized;
  impl->descs = ModelTensors(config.shape, ServeDType(config.format));
  std::sort(impl->descs.begin(), impl->descs.end(),
            [](const TensorDesc& a, const TensorDesc& b) { return a.name < b.name; });

  const uint64_t layers = config.shape.num_hidden_layers;
  // Residual-branch outputs start smaller (GPT-2 / Megatron practice) so the
  // initial model is not an outlier; the serve-view statistics barely care.
  const float residual_std = static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(layers)));
  uint64_t offset = 0;
  for (size_t i = 0; i < impl->descs.size(); ++i) {
    const TensorDesc& d = impl->descs[i];
    Impl::Tensor t;
    t.offset = offset;
    t.elements = d.elements();
    t.name_hash = HashName(d.name);
    if (EndsWith(d.name, "norm.weight")) {
      t.init_mean = 1.0f;
      t.init_std = 0.02f;
    } else if (EndsWith(d.name, "o_proj.weight") || EndsWith(d.name, "down_proj.weight")) {
      t.init_std = residual_std;
    } else {
      t.init_std = 0.02f;
    }
    // Per-tensor gradient scale, 2^-14 .. 2^-6: exact powers of two times
    // [1, 2), so no libm. Adam is nearly scale-free; eps makes it matter a bit.
    const uint64_t r = Draw(StreamKey(config.seed, t.name_hash, kScaleStream, 0), 0);
    const float mantissa = 1.0f + static_cast<float>(r & 0xffffff) / 16777216.0f;
    t.grad_scale = std::ldexp(mantissa, -14 + static_cast<int>((r >> 60) & 7));
    for (uint64_t b = 0; b < t.elements; b += kBlockElements)
      impl->blocks.push_back(Impl::Block{static_cast<uint32_t>(i), b,
                                         std::min(t.elements, b + kBlockElements)});
    impl->tensors.push_back(t);
    offset += t.elements;
  }
  impl->elements = offset;
  TERN_ASSERT(offset == config.shape.parameters());

  impl->master = Allocate<float>(offset);
  impl->moment1 = Allocate<float>(offset);
  impl->moment2 = Allocate<float>(offset);
  if (!impl->quantized) impl->view_bits = Allocate<uint16_t>(offset);
  if (!impl->master || !impl->moment1 || !impl->moment2 ||
      (!impl->quantized && !impl->view_bits))
    return TERN_ERROR(kResourceExhausted, "cannot allocate ",
                      MemoryBytesFor(config.shape, config.format), " bytes for a ", offset,
                      "-parameter trace");
  if (impl->quantized) {
    TERN_RETURN_IF_ERROR(impl->PlanQuantized());
  } else {
    for (size_t i = 0; i < impl->descs.size(); ++i)
      impl->view.tensors.push_back(TensorRef{
          &impl->descs[i],
          reinterpret_cast<const uint8_t*>(impl->view_bits.get() + impl->tensors[i].offset)});
  }
  TERN_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<TraceGenerator>(new TraceGenerator(std::move(impl)));
}

Status TraceGenerator::Step() {
  return impl_->Advance();
}

Result<std::span<const float>> TraceGenerator::master(std::string_view name) const {
  for (size_t i = 0; i < impl_->descs.size(); ++i)
    if (impl_->descs[i].name == name)
      return std::span<const float>(impl_->master.get() + impl_->tensors[i].offset,
                                    impl_->tensors[i].elements);
  return TERN_ERROR(kNotFound, "no model tensor ", name);
}

std::string TraceGenerator::config_json() const {
  const TraceConfig& c = impl_->config;
  nlohmann::ordered_json config = ModelConfig(c.shape, ServeDType(c.format));
  if (c.format == ServeFormat::kQuantized) {
    // tern_quant's public form of the config is a string: parse it back (our
    // own output, so a failure is a bug, not bad input).
    auto q = nlohmann::ordered_json::parse(QuantizationConfigJson(c.quant), nullptr,
                                           /*allow_exceptions=*/false);
    TERN_ASSERT(!q.is_discarded(), "QuantizationConfigJson is not JSON");
    config["quantization_config"] = std::move(q);
  }
  return config.dump(2) + "\n";
}

uint64_t TraceGenerator::step() const { return impl_->step; }
const ServeView& TraceGenerator::view() const { return impl_->view; }
const StepStats& TraceGenerator::last_stats() const { return impl_->stats; }
const TraceConfig& TraceGenerator::config() const { return impl_->config; }
uint64_t TraceGenerator::memory_bytes() const {
  return MemoryBytesFor(impl_->config.shape, impl_->config.format);
}

}  // namespace tern
