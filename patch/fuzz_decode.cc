// Fuzzer: arbitrary bytes as a patch. Every decoder entry point must return
// an error or a consistent result, never crash or hang.
#include <cstddef>
#include <cstdint>

#include "tern/thread_pool.h"
#include "patch/reference_decoder.h"
#include "patch/test_util.h"
#include "tern/patch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  std::span<const uint8_t> in(data, size);
  auto info = Inspect(in);
  auto ref = patch::ReferenceDecode(in);
  TERN_ASSERT(info.ok() == ref.ok(), "fast and reference decoders disagree on validity");
  auto prefix = VerifiedPrefixBytes(in);
  if (prefix.ok()) TERN_ASSERT(*prefix <= size);
  if (info.ok()) {
    // Apply to a zero view of the patch's layout with the claimed base digest:
    // must verify or fail cleanly (the digest will usually not match).
    testing::OwnedView v;
    uint64_t bytes = 0;
    for (const auto& t : info->tensors) bytes += DTypeBytes(t.dtype, t.elements);
    if (bytes > (uint64_t{1} << 24)) return 0;
    for (const auto& t : info->tensors) v.Add(t.name, t.dtype, t.shape);
    testing::OwnedView x = v;
    MutableServeView mv = v.Mutable(), xv = x.Mutable();
    ThreadPool pool(1);
    const Status s = Apply(mv, in, info->base_digest, pool);
    // Write-while-verifying fails the same way and restores what it wrote.
    ApplyOptions exclusive;
    exclusive.exclusive_view = true;
    const Status sx = Apply(xv, in, info->base_digest, pool, exclusive);
    TERN_ASSERT(s.ToString() == sx.ToString(), "apply paths disagree: ", s.ToString(), " vs ", sx.ToString());
    TERN_ASSERT(x.data == v.data, "exclusive apply left a different view");
  }
  return 0;
}
