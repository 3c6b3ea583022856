// libFuzzer target: the sidecar's request lane on arbitrary client bytes
// (docs/engines.md, "The request lane"). The first byte picks the surface:
//   even: a request body, then the two X-Tern headers (the rest split in
//         three at '\n'): TakeConstraint either removes "weight_version" or
//         leaves the body exactly as it was; a constraint it returns is
//         consistent (an exact version at or above its floor satisfies it);
//   odd:  an engine's server-sent event stream fed to the EventStamper in
//         pieces cut at the input's own bytes: never crashes, bounded
//         output, and a stream with no "data:" line passes through unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/sidecar/request_lane.h"

namespace {

using tern::agent::Json;

void FuzzRequest(std::string_view in) {
  const size_t a = in.find('\n');
  const std::string_view body_text = in.substr(0, a);
  std::string_view rest = a == std::string_view::npos ? std::string_view() : in.substr(a + 1);
  const size_t b = rest.find('\n');
  const std::string_view min_header = rest.substr(0, b);
  const std::string_view staleness_header =
      b == std::string_view::npos ? std::string_view() : rest.substr(b + 1);

  Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) return;
  const Json before = body;
  auto c = tern::agent::TakeConstraint(body);
  if (!c.ok()) {
    if (body != before) std::abort();  // a refused body is left as it was
    return;
  }
  if (body.contains("weight_version")) std::abort();
  if (c->exact_version && !c->SatisfiedBy(c->exact_version)) std::abort();
  (void)c->ToString();
  const uint64_t head = body_text.size() * 7;  // any head will do
  auto folded = tern::agent::WithHeaders(*c, min_header, staleness_header, head);
  if (folded.ok()) {
    if (folded->exact_version && folded->min_version &&
        *folded->exact_version < *folded->min_version) {
      std::abort();  // WithHeaders promises to refuse this
    }
    (void)tern::agent::NotReadyBody(*folded, head);
  }
  tern::agent::StampResponse(body, 3, 4);
}

void FuzzStream(std::string_view in, bool meta_info) {
  constexpr size_t kMaxEvent = 256;  // small, so the pass-through path is reached
  tern::agent::EventStamper stamper(/*start_version=*/5, meta_info, kMaxEvent);
  std::string out;
  size_t at = 0;
  while (at < in.size()) {
    // Cut lengths from the input itself: 1..16 bytes a piece.
    const size_t len = 1 + (static_cast<uint8_t>(in[at]) & 15);
    stamper.Feed(in.substr(at, len), /*end_version=*/6, out);
    at += len;
  }
  stamper.Flush(out);
  // Each event gains at most its stamps (two u64 keys and their punctuation,
  // or a re-encoded meta_info object, bounded by the event's own size).
  if (out.size() > 4 * in.size() + 128 * (in.size() / 2 + 1)) std::abort();
  if (in.find("data:") == std::string_view::npos && out != in) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    FuzzRequest(in);
  } else {
    FuzzStream(in, (data[0] & 2) != 0);
  }
  return 0;
}
