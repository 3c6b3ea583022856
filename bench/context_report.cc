// context_report: where the bits of a BF16 patch go when positions and values
// are coded given the base (docs/benchmarks.md "Patch format 2").
//
// Steps a datagen trace and, per step, compares the order-0 bound (every
// element equally likely to change; values by one histogram), format 1 and
// format 2 as written by Diff, with bounds conditioned on contexts the
// receiver can compute from the base:
//  * exp: the exponent field of the base element (256 classes per tensor);
//  * bucketK: K classes, clamp(e0 - exponent, 0, K-1) with e0 chosen per
//    1M-element segment to minimise the bound (what format 2 can transmit);
//  * exp+prev: the exponent and whether the element changed in the previous
//    step (a context the receiver could keep, at a cost in memory);
//  * bucket16, flat positions: the values coded in bucket16's classes but
//    the positions over the whole segment (one order-0 gap code), which a
//    decoder could resolve without classifying every element of the base
//    (the class masks, ~1x a memcpy), reading only the changed elements'.
// The bound of a class split is sum over classes n_c H(c_c/n_c) for positions
// plus the empirical value entropy within each class.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "tern/datagen.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"
#include "tools/cli_args.h"

namespace tern::bench {
namespace {

double H2(double p) { return p <= 0 || p >= 1 ? 0.0 : -(p * std::log2(p) + (1 - p) * std::log2(1 - p)); }

// Per class: elements, changes and a histogram of zigzag deltas.
struct Class {
  uint64_t n = 0, c = 0;
  std::map<uint32_t, uint64_t> values;
  void Add(const Class& o) {
    n += o.n;
    c += o.c;
    for (auto [z, k] : o.values) values[z] += k;
  }
  double PositionBits() const { return double(n) * H2(double(c) / double(n ? n : 1)); }
  double ValueBits() const {
    double bits = 0;
    for (auto [z, k] : values) bits -= double(k) * std::log2(double(k) / double(c));
    return bits;
  }
};

uint32_t Zig(uint16_t a, uint16_t b) {
  const uint16_t d = static_cast<uint16_t>(b - a);
  const int16_t s = static_cast<int16_t>(d);
  return s < 0 ? uint32_t(-2 * int32_t(s) - 1) : uint32_t(2 * int32_t(s));
}

struct Args {
  uint64_t params = 0, steps = 0, seed = 0;
  double lr = 1e-6;
  uint64_t segment = uint64_t{1} << 20;
};

Status Run(const Args& a) {
  ThreadPool pool(0);
  TraceConfig config;
  TERN_ASSIGN_OR_RETURN(config.shape, ChooseModelShape(a.params));
  config.seed = a.seed;
  config.adam.lr = a.lr;
  config.format = ServeFormat::kBF16;
  TERN_ASSIGN_OR_RETURN(auto gen, TraceGenerator::Create(config, pool));
  std::printf("## context_report: %llu params, BF16, Adam lr %g, seed %llu, segments of %llu\n\n",
              static_cast<unsigned long long>(config.shape.parameters()), a.lr,
              static_cast<unsigned long long>(a.seed), static_cast<unsigned long long>(a.segment));
  std::printf(
      "| step | changed%% | order-0 bound MB | format 1 MB | f1/bound | format 2 MB | f2/bound | "
      "f2/f1 | "
      "exp bound | bucket4 | bucket8 | bucket16 | bucket16, flat positions | exp+prev | "
      "pos bits/chg order-0 -> exp | value bits/chg order-0 -> exp |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::vector<uint8_t>> prev_changed;  // per tensor, 1 byte per element
  struct Breakdown {
    uint64_t step;
    double changed, pos, val, head;
    uint64_t segments, tensors;
  };
  std::vector<Breakdown> breakdown;
  for (uint64_t step = 1; step <= a.steps; ++step) {
    // Snapshot the old view.
    std::vector<TensorDesc> descs;
    std::vector<std::vector<uint8_t>> old_bytes;
    for (const auto& t : gen->view().tensors) {
      descs.push_back(*t.desc);
      old_bytes.emplace_back(t.data, t.data + t.desc->bytes());
    }
    TERN_RETURN_IF_ERROR(gen->Step());
    const ServeView& nv = gen->view();
    ServeView ov;
    for (size_t t = 0; t < descs.size(); ++t) ov.tensors.push_back({&descs[t], old_bytes[t].data()});

    DiffOptions d1;
    d1.format_version = 1;
    TERN_ASSIGN_OR_RETURN(auto p1, Diff(ov, nv, d1, pool));
    DiffOptions d2;
    d2.format_version = 2;
    TERN_ASSIGN_OR_RETURN(auto p2, Diff(ov, nv, d2, pool));
    TERN_ASSIGN_OR_RETURN(PatchInfo i2, Inspect(p2));
    breakdown.push_back({step, double(i2.changed_elements), double(i2.position_bytes), double(i2.value_bytes),
                         double(i2.header_bytes + i2.container_bytes), i2.segments, i2.tensors.size()});
    {  // format 2 must reproduce the target exactly
      std::vector<std::vector<uint8_t>> work = old_bytes;
      MutableServeView mv;
      for (size_t t = 0; t < descs.size(); ++t) mv.tensors.push_back({&descs[t], work[t].data()});
      TERN_RETURN_IF_ERROR(Apply(mv, p2, ComputeDigest(ov, pool), pool));
      for (size_t t = 0; t < descs.size(); ++t)
        TERN_REQUIRE(std::memcmp(work[t].data(), nv.tensors[t].data, descs[t].bytes()) == 0, kInternal,
                     "format 2 apply is not bit-exact");
    }

    Class all;
    double exp_bits = 0, prev_bits = 0, bucket_bits[3] = {0, 0, 0}, flat_pos_bits = 0;
    Class exp_total_pos;  // not used for bits; sums
    double exp_pos_bits = 0, exp_val_bits = 0;
    const int ks[3] = {4, 8, 16};
    if (prev_changed.size() != descs.size()) prev_changed.assign(descs.size(), {});
    for (size_t t = 0; t < descs.size(); ++t) {
      if (descs[t].dtype != DType::kBF16) continue;
      const uint64_t n = descs[t].elements();
      const uint16_t* o = reinterpret_cast<const uint16_t*>(old_bytes[t].data());
      const uint16_t* w = reinterpret_cast<const uint16_t*>(nv.tensors[t].data);
      std::vector<uint8_t>& pc = prev_changed[t];
      const bool have_prev = pc.size() == n;
      std::vector<uint8_t> now(n, 0);
      Class by_exp_tensor[256], by_exp_prev[512];
      for (uint64_t s0 = 0; s0 < n; s0 += a.segment) {
        const uint64_t s1 = std::min(n, s0 + a.segment);
        Class seg_exp[256];
        for (uint64_t i = s0; i < s1; ++i) {
          const int e = (o[i] >> 7) & 0xff;
          const bool ch = o[i] != w[i];
          Class& ce = seg_exp[e];
          ce.n++;
          Class& cp = by_exp_prev[e * 2 + (have_prev && pc[i])];
          cp.n++;
          all.n++;
          if (ch) {
            now[i] = 1;
            const uint32_t z = Zig(o[i], w[i]);
            ce.c++, ce.values[z]++;
            cp.c++, cp.values[z]++;
            all.c++, all.values[z]++;
          }
        }
        Class seg_all;
        for (int e = 0; e < 256; ++e) {
          by_exp_tensor[e].Add(seg_exp[e]);
          seg_all.n += seg_exp[e].n;
          seg_all.c += seg_exp[e].c;
        }
        // Buckets: the best e0 per segment for each K; with K = 16 also
        // the best for its values with the segment's positions in one code.
        for (int ki = 0; ki < 3; ++ki) {
          const int k = ks[ki];
          double best = 1e300, best_flat = 1e300;
          for (int e0 = 0; e0 < 256; ++e0) {
            Class b[16];
            for (int e = 0; e < 256; ++e) b[std::clamp(e0 - e, 0, k - 1)].Add(seg_exp[e]);
            double pos = 0, val = 0;
            for (int c = 0; c < k; ++c) pos += b[c].PositionBits(), val += b[c].ValueBits();
            best = std::min(best, pos + val);
            best_flat = std::min(best_flat, seg_all.PositionBits() + val);
          }
          bucket_bits[ki] += best;
          if (k == 16) flat_pos_bits += best_flat;
        }
      }
      for (int e = 0; e < 256; ++e) {
        exp_pos_bits += by_exp_tensor[e].PositionBits();
        exp_val_bits += by_exp_tensor[e].ValueBits();
      }
      for (int e = 0; e < 512; ++e) prev_bits += by_exp_prev[e].PositionBits() + by_exp_prev[e].ValueBits();
      pc = std::move(now);
    }
    exp_bits = exp_pos_bits + exp_val_bits;
    const double order0 = (all.PositionBits() + all.ValueBits()) / 8;
    auto mb = [](double bytes) { return bytes / 1e6; };
    std::printf(
        "| %llu | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f (%.3f) | %.3f (%.3f) | "
        "%.3f (%.3f) | "
        "%.3f (%.3f) | %.3f (%.3f) | %.3f (%.3f) | %.2f -> %.2f | %.2f -> %.2f |\n",
        static_cast<unsigned long long>(step), 100.0 * double(all.c) / double(all.n), mb(order0),
        mb(double(p1.size())), double(p1.size()) / order0, mb(double(p2.size())),
        double(p2.size()) / order0, double(p2.size()) / double(p1.size()), mb(exp_bits / 8),
        exp_bits / 8 / order0, mb(bucket_bits[0] / 8), bucket_bits[0] / 8 / order0,
        mb(bucket_bits[1] / 8), bucket_bits[1] / 8 / order0, mb(bucket_bits[2] / 8),
        bucket_bits[2] / 8 / order0, mb(flat_pos_bits / 8), flat_pos_bits / 8 / order0,
        mb(prev_bits / 8), prev_bits / 8 / order0, all.PositionBits() / double(all.c),
        exp_pos_bits / double(all.c), all.ValueBits() / double(all.c),
        exp_val_bits / double(all.c));
    std::fflush(stdout);
  }
  std::printf("\nFormat 2, where the bytes go (bits per changed element):\n\n"
              "| step | positions | values | tables, headers, container | records |\n|---|---|---|---|---|\n");
  for (const Breakdown& b : breakdown)
    std::printf("| %llu | %.2f | %.2f | %.2f | %llu |\n", static_cast<unsigned long long>(b.step),
                8 * b.pos / b.changed, 8 * b.val / b.changed, 8 * b.head / b.changed,
                static_cast<unsigned long long>(b.segments));
  std::printf("\nBF16 tensors only (norms included). Bounds in MB (1e6 bytes), with their ratio to the "
              "order-0 bound in parentheses.\n");
  return Status::Ok();
}

}  // namespace
}  // namespace tern::bench

int main(int argc, char** argv) {
  using namespace tern;
  CLI::App app("per-step context-conditioned bounds vs format 1 and 2", "context_report");
  cli::Configure(app);
  bench::Args a;
  cli::AddCount(app, "--params", a.params, "trace model size in parameters", "20M");
  cli::AddUnsigned(app, "--steps", a.steps, "steps to measure", "3");
  cli::AddUnsigned(app, "--seed", a.seed, "trace seed", "1");
  app.add_option("--lr", a.lr, "Adam learning rate")->default_val("1e-6");
  cli::Dispatch dispatch;
  dispatch.On(&app, {[] { return Status::Ok(); }, [&] { return bench::Run(a); }});
  return dispatch.Run(app, argc, argv);
}
