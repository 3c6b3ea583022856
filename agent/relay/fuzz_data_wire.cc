// Fuzzer: arbitrary bytes as every data-plane message (agent/relay/data_wire.h).
// A decoder must refuse or return a message that re-encodes to exactly the
// input (the encoding is canonical); nothing may crash, hang or read out of
// bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "agent/relay/data_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern::agent;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (auto m = DecodeSubscribe(in); m.ok()) TERN_ASSERT(EncodeSubscribe(*m) == in);
  if (auto m = DecodeOffer(in); m.ok()) TERN_ASSERT(EncodeOffer(*m) == in);
  if (auto m = DecodeHashes(in); m.ok()) TERN_ASSERT(EncodeHashes(*m) == in);
  if (auto m = DecodeWant(in); m.ok()) TERN_ASSERT(EncodeWant(*m) == in);
  if (auto m = DecodeFetch(in); m.ok()) TERN_ASSERT(EncodeFetch(*m) == in);
  if (auto m = DecodeGone(in); m.ok()) TERN_ASSERT(EncodeGone(*m) == in);
  if (auto m = DecodePush(in); m.ok()) TERN_ASSERT(EncodePush(*m) == in);
  if (auto m = DecodePushDone(in); m.ok()) TERN_ASSERT(EncodePushDone(*m) == in);
  return 0;
}
