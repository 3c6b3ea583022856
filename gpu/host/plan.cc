#include "gpu/host/plan.h"

#include <algorithm>

#include "gpu/ops/encode_ops.h"

namespace tern::gpu {

ApplyPlan PlanApply(const std::vector<WalkedRecord>& records, uint64_t scratch_bytes) {
  ApplyPlan p;
  p.change_at.resize(records.size());
  for (uint64_t r = 0; r < records.size(); ++r) {
    const WalkedRecord& wr = records[r];
    const uint64_t need = wr.h.changed_count * kApplyChangeBytes + wr.total_bytes;
    if (p.batches.empty() || p.batches.back().changes * kApplyChangeBytes +
                                     (p.batches.back().bytes_end - p.batches.back().bytes_begin) + need >
                                 scratch_bytes)
      p.batches.push_back(ApplyBatch{r, r, wr.offset, wr.offset, 0});
    ApplyBatch& b = p.batches.back();
    p.change_at[r] = b.changes;
    b.changes += wr.h.changed_count;
    b.rec_end = r + 1;
    b.bytes_end = wr.offset + wr.total_bytes;
    p.max_changes = std::max(p.max_changes, b.changes);
    p.max_bytes = std::max(p.max_bytes, b.bytes_end - b.bytes_begin);
  }
  return p;
}

DiffPlan PlanDiff(const ServeView& layout, uint64_t segment_elements, uint64_t scratch_bytes) {
  DiffPlan p;
  for (uint32_t t = 0; t < layout.tensors.size(); ++t) {
    const TensorDesc& desc = *layout.tensors[t].desc;
    const int w = ElementBits(desc.dtype);
    const uint64_t seg = (w == 4 && segment_elements % 2) ? segment_elements + 1 : segment_elements;
    const uint64_t n = desc.elements();
    for (uint64_t first = 0; first < n; first += seg) {
      DiffSegment s;
      s.tensor = t;
      s.w = w;
      s.first = first;
      s.count = std::min(seg, n - first);
      s.out_capacity = MaxRecordBodyBytes(s.count, w);
      p.segments.push_back(s);
    }
  }
  uint64_t elements = 0, out = 0;
  size_t begin = 0;
  for (size_t i = 0; i < p.segments.size(); ++i) {
    DiffSegment& s = p.segments[i];
    const uint64_t need = s.count * 12 + s.out_capacity;
    if (i > begin && elements * 12 + out + need > scratch_bytes) {
      p.batches.emplace_back(begin, i);
      begin = i;
      elements = out = 0;
    }
    s.scratch_at = elements;
    s.out_at = out;
    elements += s.count;
    out += s.out_capacity;
    p.max_elements = std::max(p.max_elements, elements);
    p.max_out = std::max(p.max_out, out);
    p.max_segments = std::max<uint64_t>(p.max_segments, i + 1 - begin);
  }
  if (begin < p.segments.size()) p.batches.emplace_back(begin, p.segments.size());
  return p;
}

}  // namespace tern::gpu
