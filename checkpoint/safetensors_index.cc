#include "checkpoint/safetensors_index.h"

#include <algorithm>

#include "base/path.h"
#include "checkpoint/strict_json.h"

namespace tern::checkpoint {
namespace {

using json::Event;
using json::Quoted;
using json::Token;

// {"weight_map": {NAME: FILE, ...}, anything else: any JSON}
// Parsed on nlohmann-json's SAX parser (why not simdjson: checkpoint/strict_json.h).
class IndexSax final : public json::StrictSax {
 public:
  explicit IndexSax(WeightMap* out) : StrictSax(/*depth_max=*/16), out_(out) {}
  bool have_map() const { return have_map_; }

 private:
  enum class State { kTop, kTopKey, kIgnored, kMap };

  bool On(Event e, Token t) override {
    switch (state_) {
      case State::kTop:
        TERN_ASSERT(e == Event::kBeginObject);  // ParseObject checked the first byte
        state_ = State::kTopKey;
        return true;
      case State::kTopKey:
        if (e == Event::kEndObject) return true;
        if (*t.text != "weight_map") {
          state_ = State::kIgnored;
          return true;
        }
        if (have_map_) return Fail(TERN_ERROR(kCorrupt, "duplicate \"weight_map\""));
        have_map_ = true;
        state_ = State::kMap;
        return true;
      case State::kIgnored:
        SkipValue(e);
        state_ = State::kTopKey;
        return true;
      case State::kMap: {
        // Duplicate tensors are found once the map is sorted (ParseIndex).
        Result<bool> done = map_.Next(e, t, [this](std::string tensor, std::string file) {
          TERN_REQUIRE(PlainFileName(file), kCorrupt, "weight_map entry ", Quoted(tensor),
                       " names ", Quoted(file),
                       ", which is not a plain file name in the directory");
          out_->emplace_back(std::move(tensor), std::move(file));
          return Status::Ok();
        });
        if (!done.ok()) return Fail(done.status());
        if (*done) state_ = State::kTopKey;
        return true;
      }
    }
    return true;
  }

  WeightMap* out_;
  State state_ = State::kTop;
  bool have_map_ = false;
  json::StringMapReader map_{"\"weight_map\""};
};

}  // namespace

Result<WeightMap> ParseIndex(std::string_view text) {
  TERN_REQUIRE(text.size() <= kIndexBytesMax, kCorrupt, "index of ", text.size(),
               " bytes exceeds the limit of ", kIndexBytesMax, " bytes");
  WeightMap weight_map;
  IndexSax sax(&weight_map);
  TERN_RETURN_IF_ERROR(json::ParseObject(text, "index", &sax));
  TERN_REQUIRE(sax.have_map(), kCorrupt, "index has no \"weight_map\"");
  std::sort(weight_map.begin(), weight_map.end());
  for (size_t i = 1; i < weight_map.size(); ++i)
    TERN_REQUIRE(weight_map[i].first != weight_map[i - 1].first, kCorrupt,
                 "weight_map names tensor ", Quoted(weight_map[i].first), " twice");
  return weight_map;
}

Result<std::string> SerializeIndex(uint64_t total_size, const WeightMap& weight_map) {
  // nlohmann::json keeps object keys sorted by bytes, which for UTF-8 is
  // Python's sort_keys order (by code point).
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [tensor, file] : weight_map) map[tensor] = file;
  nlohmann::json index = {{"metadata", {{"total_size", total_size}}},
                          {"weight_map", std::move(map)}};
  try {
    return index.dump(/*indent=*/2, ' ', /*ensure_ascii=*/true) + "\n";
  } catch (const nlohmann::json::type_error& e) {
    return TERN_ERROR(kInvalidArgument, "a tensor or file name is not valid UTF-8 (", e.what(),
                      ")");
  }
}

}  // namespace tern::checkpoint
