// Fuzzer: what a board finds on disk. The first byte picks the mode:
//  even: the rest is a record's payload, appended through the file log (so
//        its framing is valid) and then recovered by a Board, which must
//        refuse anything not signed by the trusted key or inconsistent;
//  odd:  the rest is a record file's raw bytes, which the file log's
//        decoder must refuse or accept without crashing.
// Nothing may crash, hang or allocate without bound.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "agent/board/board.h"
#include "agent/board/board_log.h"

namespace {

const tern::ManifestVerifier& FixedVerifier() {
  static const tern::ManifestVerifier* v = [] {
    auto signer = tern::ManifestSigner::FromSeed(std::array<uint8_t, 32>{7});
    TERN_ASSERT(signer.ok());
    auto* out = new tern::ManifestVerifier;
    TERN_ASSERT(out->AddTrustedKey(signer->public_key()).ok());
    return out;
  }();
  return *v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  if (size == 0) return 0;
  auto env = NewMemEnv();
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto log = agent::OpenFileBoardLog(*env, "/b");
    TERN_ASSERT(log.ok());
    if (rest.size() >= 32) {  // the board id a manifest would carry
      BoardId id;
      std::memcpy(id.data(), rest.data() + 16, 16);
      TERN_ASSERT((*log)->InitId(id).ok());
    }
    if (!(*log)->Append({0, 1}, 0, rest, true, {0, 0}).ok()) return 0;
    auto reopened = agent::OpenFileBoardLog(*env, "/b");
    TERN_ASSERT(reopened.ok());
    auto board = agent::Board::Open(*env, "/o", std::move(reopened).value(), FixedVerifier(), {},
                                    [](std::string_view) {});
    if (board.ok()) {
      TERN_ASSERT((*board)->head() == 1);
      TERN_ASSERT((*board)->Manifest(1).ok());
      (void)(*board)->PlanCatchUp(0, 1);
    }
    return 0;
  }
  TERN_ASSERT(env->CreateDir("/b").ok());
  TERN_ASSERT(WriteNewFile(*env, "/b/00000000000000000001-0000000000.rec",
                           {reinterpret_cast<const uint8_t*>(rest.data()), rest.size()})
                  .ok());
  auto log = agent::OpenFileBoardLog(*env, "/b");
  if (log.ok()) {
    auto all = (*log)->LoadAll();
    TERN_ASSERT(all.ok() && all->size() == 1 && (*all)[0].version == 1);
  }
  return 0;
}
