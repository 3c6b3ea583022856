#include "checkpoint/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "checkpoint/strict_json.h"
#include "tern/checkpoint.h"

namespace tern::checkpoint {
namespace {

// Dtypes the reference library knows that tern has no DType for yet.
bool ReferenceOnlyDType(std::string_view name) {
  return name == "C64" || name == "F6_E2M3" || name == "F6_E3M2" || name == "F8_E4M3FNUZ" ||
         name == "F8_E5M2FNUZ";
}

using json::Event;
using json::Quoted;
using json::Token;

// The header's schema, checked event by event on nlohmann-json's SAX
// parser (why nlohmann and not simdjson: checkpoint/strict_json.h):
//   {"__metadata__": {str: str, ...},
//    NAME: {"dtype": str, "shape": [u64, ...], "data_offsets": [u64, u64]}, ...}
class HeaderSax final : public json::StrictSax {
 public:
  explicit HeaderSax(ParsedHeader* out) : StrictSax(/*depth_max=*/8), out_(out) {}

 private:
  enum class State {
    kTop,
    kTopKey,
    kMetadata,
    kTensor,
    kTensorKey,
    kDType,
    kShape,
    kShapeItem,
    kOffsets,
    kOffsetsItem,
  };

  bool On(Event e, Token t) override {
    switch (state_) {
      case State::kTop:
        TERN_ASSERT(e == Event::kBeginObject);  // ParseObject checked the first byte
        state_ = State::kTopKey;
        return true;
      case State::kTopKey:
        if (e == Event::kEndObject) return true;  // the end: ParseObject checks what follows
        if (*t.text == "__metadata__") {
          if (out_->has_metadata) return Fail(TERN_ERROR(kCorrupt, "duplicate __metadata__"));
          out_->has_metadata = true;
          state_ = State::kMetadata;
          return true;
        }
        tensor_ = HeaderTensor{};
        tensor_.desc.name = std::move(*t.text);
        have_dtype_ = have_shape_ = have_offsets_ = false;
        state_ = State::kTensor;
        return true;
      case State::kMetadata: {
        Result<bool> done = metadata_.Next(e, t, [this](std::string key, std::string value) {
          auto [at, fresh] = out_->metadata.try_emplace(std::move(key), std::move(value));
          TERN_REQUIRE(fresh, kCorrupt, "duplicate __metadata__ key ", Quoted(at->first));
          return Status::Ok();
        });
        if (!done.ok()) return Fail(done.status());
        if (*done) state_ = State::kTopKey;
        return true;
      }
      default:
        return OnTensor(e, t);
    }
  }

  // Inside one tensor's object; errors name the tensor.
  bool OnTensor(Event e, Token t) {
    Status s = TensorEvent(e, t);
    if (s.ok()) return true;
    return Fail(s.WithContext("tensor " + Quoted(tensor_.desc.name)));
  }

  Status TensorEvent(Event e, Token t) {
    switch (state_) {
      case State::kTensor:
        TERN_REQUIRE(e == Event::kBeginObject, kCorrupt,
                     "expected '{' (an object of dtype, shape and data_offsets), got ",
                     json::EventName(e));
        state_ = State::kTensorKey;
        return Status::Ok();
      case State::kTensorKey:
        if (e == Event::kEndObject) {
          TERN_REQUIRE(have_dtype_ && have_shape_ && have_offsets_, kCorrupt,
                       "needs \"dtype\", \"shape\" and \"data_offsets\"");
          out_->tensors.push_back(std::move(tensor_));
          state_ = State::kTopKey;
          return Status::Ok();
        }
        if (*t.text == "dtype") {
          TERN_REQUIRE(!have_dtype_, kCorrupt, "duplicate key \"dtype\"");
          have_dtype_ = true;
          state_ = State::kDType;
        } else if (*t.text == "shape") {
          TERN_REQUIRE(!have_shape_, kCorrupt, "duplicate key \"shape\"");
          have_shape_ = true;
          state_ = State::kShape;
        } else if (*t.text == "data_offsets") {
          TERN_REQUIRE(!have_offsets_, kCorrupt, "duplicate key \"data_offsets\"");
          have_offsets_ = true;
          state_ = State::kOffsets;
        } else {
          return TERN_ERROR(kCorrupt, "unknown key ", Quoted(*t.text));
        }
        return Status::Ok();
      case State::kDType: {
        TERN_REQUIRE(e == Event::kString, kCorrupt, "dtype: expected a string, got ",
                     json::EventName(e));
        std::optional<DType> d = DTypeFromName(*t.text);
        if (!d) {
          TERN_REQUIRE(!ReferenceOnlyDType(*t.text), kUnsupported, "dtype ", Quoted(*t.text),
                       " is valid safetensors but tern does not support it yet");
          return TERN_ERROR(kCorrupt, "unknown dtype ", Quoted(*t.text));
        }
        tensor_.desc.dtype = *d;
        state_ = State::kTensorKey;
        return Status::Ok();
      }
      case State::kShape:
        TERN_REQUIRE(e == Event::kBeginArray, kCorrupt, "shape: expected an array, got ",
                     json::EventName(e));
        state_ = State::kShapeItem;
        return Status::Ok();
      case State::kShapeItem:
        if (e == Event::kEndArray) {
          state_ = State::kTensorKey;
          return Status::Ok();
        }
        if (e != Event::kUnsigned) return NotU64(e, t).WithContext("shape");
        TERN_REQUIRE(tensor_.desc.shape.size() < kRankMax, kCorrupt, "shape has more than ",
                     kRankMax, " dimensions");
        tensor_.desc.shape.push_back(t.u64);
        return Status::Ok();
      case State::kOffsets:
        TERN_REQUIRE(e == Event::kBeginArray, kCorrupt, "data_offsets: expected an array, got ",
                     json::EventName(e));
        offsets_seen_ = 0;
        state_ = State::kOffsetsItem;
        return Status::Ok();
      case State::kOffsetsItem:
        if (e == Event::kEndArray) {
          TERN_REQUIRE(offsets_seen_ == 2, kCorrupt, "data_offsets needs two integers");
          state_ = State::kTensorKey;
          return Status::Ok();
        }
        if (e != Event::kUnsigned) return NotU64(e, t).WithContext("data_offsets");
        TERN_REQUIRE(offsets_seen_ < 2, kCorrupt, "data_offsets has more than two integers");
        (offsets_seen_++ == 0 ? tensor_.begin_bytes : tensor_.end_bytes) = t.u64;
        return Status::Ok();
      default:
        TERN_ASSERT(false, "unreachable header state");
        return Status::Ok();
    }
  }

  ParsedHeader* out_;
  State state_ = State::kTop;
  json::StringMapReader metadata_{"__metadata__"};
  HeaderTensor tensor_;
  bool have_dtype_ = false, have_shape_ = false, have_offsets_ = false;
  int offsets_seen_ = 0;
};

Status CheckLayout(ParsedHeader& header, uint64_t data_bytes) {
  auto& tensors = header.tensors;
  // Names must be unique: sort a permutation by name.
  std::vector<const HeaderTensor*> by_name;
  by_name.reserve(tensors.size());
  for (const auto& t : tensors) by_name.push_back(&t);
  std::sort(by_name.begin(), by_name.end(),
            [](const HeaderTensor* a, const HeaderTensor* b) { return a->desc.name < b->desc.name; });
  for (size_t i = 1; i < by_name.size(); ++i)
    TERN_REQUIRE(by_name[i]->desc.name != by_name[i - 1]->desc.name, kCorrupt,
                 "duplicate tensor ", Quoted(by_name[i]->desc.name));

  for (const auto& t : tensors) {
    // Only quoted on the error path: this loop runs once per tensor.
    auto name = [&t] { return Quoted(t.desc.name); };
    TERN_REQUIRE(t.begin_bytes <= t.end_bytes, kCorrupt, "tensor ", name(), ": data_offsets [",
                 t.begin_bytes, ", ", t.end_bytes, "] end before they begin");
    Result<uint64_t> elements = CheckedElements(t.desc.dtype, t.desc.shape);
    TERN_REQUIRE(elements.ok(), kCorrupt, "tensor ", name(), ": ", elements.status().message());
    TERN_REQUIRE(ElementBits(t.desc.dtype) % 8 == 0 || *elements % 2 == 0, kCorrupt, "tensor ",
                 name(), ": ", DTypeName(t.desc.dtype), " with an odd element count (", *elements,
                 ") does not fill whole bytes");
    const uint64_t bytes = DTypeBytes(t.desc.dtype, *elements);
    TERN_REQUIRE(t.end_bytes - t.begin_bytes == bytes, kCorrupt, "tensor ", name(), ": ",
                 DTypeName(t.desc.dtype), " shape needs ", bytes, " bytes but data_offsets span ",
                 t.end_bytes - t.begin_bytes);
  }
  std::stable_sort(tensors.begin(), tensors.end(), [](const HeaderTensor& a, const HeaderTensor& b) {
    return a.begin_bytes != b.begin_bytes ? a.begin_bytes < b.begin_bytes : a.end_bytes < b.end_bytes;
  });
  uint64_t end = 0;
  const HeaderTensor* previous = nullptr;
  for (const auto& t : tensors) {
    if (t.begin_bytes < end)
      return TERN_ERROR(kCorrupt, "tensor ", Quoted(t.desc.name), " data [", t.begin_bytes, ", ",
                        t.end_bytes, ") overlaps tensor ", Quoted(previous->desc.name));
    if (t.begin_bytes > end)
      return TERN_ERROR(kCorrupt, "gap of ", t.begin_bytes - end, " bytes before tensor ",
                        Quoted(t.desc.name), " (data must be contiguous)");
    TERN_REQUIRE(t.end_bytes <= data_bytes, kCorrupt, "tensor ", Quoted(t.desc.name), " data [",
                 t.begin_bytes, ", ", t.end_bytes, ") is out of bounds: the file has ",
                 data_bytes, " data bytes");
    end = t.end_bytes;
    previous = &t;
  }
  TERN_REQUIRE(end == data_bytes, kCorrupt, "tensor data ends at byte ", end, " but the file has ",
               data_bytes, " data bytes (trailing bytes not covered)");
  return Status::Ok();
}

}  // namespace

Result<ParsedHeader> ParseHeader(std::span<const uint8_t> file, uint64_t file_bytes) {
  TERN_ASSERT(file.size() <= file_bytes);
  TERN_REQUIRE(file.size() >= kLengthBytes, kCorrupt, "file of ", file_bytes,
               " bytes is too small for a safetensors header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[i];
  TERN_REQUIRE(n <= kSafetensorsHeaderBytesMax, kCorrupt, "header length ", n,
               " exceeds the limit of ", kSafetensorsHeaderBytesMax, " bytes");
  TERN_REQUIRE(n <= file_bytes - kLengthBytes, kCorrupt, "header length ", n,
               " runs past the end of the file (", file_bytes, " bytes): truncated");
  TERN_REQUIRE(n <= file.size() - kLengthBytes, kCorrupt, "header length ", n,
               " runs past the bytes given");
  ParsedHeader header;
  header.json_bytes = n;
  const std::string_view text(reinterpret_cast<const char*>(file.data() + kLengthBytes), n);

  // Memory stays proportional to what the schema keeps: HeaderSax stores
  // names, dtypes, at most kRankMax dims and two offsets per tensor.
  HeaderSax sax(&header);
  TERN_RETURN_IF_ERROR(json::ParseObject(text, "header", &sax));
  TERN_RETURN_IF_ERROR(CheckLayout(header, file_bytes - kLengthBytes - n));
  return header;
}

Result<std::string> SerializeHeader(const std::map<std::string, std::string>& metadata,
                                    std::span<const PlacedTensor> tensors) {
  // ordered_json keeps the reference order (__metadata__, then tensors as
  // given). Members are appended to its vector directly: operator[] would
  // search the keys so far, quadratic in the tensor count.
  using nlohmann::ordered_json;
  ordered_json header = ordered_json::object();
  auto& members = header.get_ref<ordered_json::object_t&>();
  members.reserve(tensors.size() + 1);
  if (!metadata.empty()) members.emplace_back("__metadata__", metadata);
  for (const PlacedTensor& t : tensors) {
    ordered_json info = ordered_json::object();
    auto& fields = info.get_ref<ordered_json::object_t&>();
    fields.emplace_back("dtype", DTypeName(t.desc->dtype));
    fields.emplace_back("shape", t.desc->shape);
    fields.emplace_back("data_offsets", ordered_json::array({t.begin_bytes, t.end_bytes}));
    members.emplace_back(t.desc->name, std::move(info));
  }
  std::string json;
  try {
    // Compact, non-ASCII kept as UTF-8, '"', '\\' and control characters
    // escaped: what serde_json (the reference writer) emits.
    json = header.dump();
  } catch (const nlohmann::json::type_error& e) {
    return TERN_ERROR(kInvalidArgument, "a tensor name or metadata entry is not valid UTF-8 (",
                      e.what(), ")");
  }
  json.resize((json.size() + 7) / 8 * 8, ' ');
  std::string out(kLengthBytes, '\0');
  uint64_t n = json.size();
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + json;
}

}  // namespace tern::checkpoint
