#include "checkpoint/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "checkpoint/json_reader.h"
#include "tern/checkpoint.h"

namespace tern::safetensors {
namespace {

// Dtypes the reference library knows that tern has no DType for yet.
bool ReferenceOnlyDType(std::string_view name) {
  return name == "C64" || name == "F6_E2M3" || name == "F6_E3M2" || name == "F8_E4M3FNUZ" ||
         name == "F8_E5M2FNUZ";
}

std::string Quoted(std::string_view name) {
  std::string out;
  json::AppendQuoted(name.substr(0, 200), &out);
  return out;
}

Status ParseTensorInfo(json::Reader& reader, const std::string& name, HeaderTensor* out) {
  out->desc.name = name;
  bool have_dtype = false, have_shape = false, have_offsets = false;
  TERN_RETURN_IF_ERROR(reader.BeginObject());
  std::string key;
  while (true) {
    TERN_ASSIGN_OR_RETURN(bool more, reader.NextKey(&key));
    if (!more) break;
    if (key == "dtype") {
      TERN_REQUIRE(!have_dtype, kCorrupt, "duplicate key \"dtype\"");
      have_dtype = true;
      TERN_ASSIGN_OR_RETURN(std::string dtype, reader.ReadString());
      std::optional<DType> d = DTypeFromName(dtype);
      if (!d) {
        TERN_REQUIRE(!ReferenceOnlyDType(dtype), kUnsupported, "dtype ", Quoted(dtype),
                     " is valid safetensors but tern does not support it yet");
        return TERN_ERROR(kCorrupt, "unknown dtype ", Quoted(dtype));
      }
      out->desc.dtype = *d;
    } else if (key == "shape") {
      TERN_REQUIRE(!have_shape, kCorrupt, "duplicate key \"shape\"");
      have_shape = true;
      TERN_RETURN_IF_ERROR(reader.BeginArray());
      while (true) {
        TERN_ASSIGN_OR_RETURN(bool item, reader.NextItem());
        if (!item) break;
        TERN_REQUIRE(out->desc.shape.size() < kRankMax, kCorrupt, "shape has more than ",
                     kRankMax, " dimensions");
        TERN_ASSIGN_OR_RETURN(uint64_t dim, reader.ReadU64());
        out->desc.shape.push_back(dim);
      }
    } else if (key == "data_offsets") {
      TERN_REQUIRE(!have_offsets, kCorrupt, "duplicate key \"data_offsets\"");
      have_offsets = true;
      TERN_RETURN_IF_ERROR(reader.BeginArray());
      uint64_t offsets[2];
      for (uint64_t& offset : offsets) {
        TERN_ASSIGN_OR_RETURN(bool item, reader.NextItem());
        TERN_REQUIRE(item, kCorrupt, "data_offsets needs two integers");
        TERN_ASSIGN_OR_RETURN(offset, reader.ReadU64());
      }
      TERN_ASSIGN_OR_RETURN(bool extra, reader.NextItem());
      TERN_REQUIRE(!extra, kCorrupt, "data_offsets has more than two integers");
      out->begin_bytes = offsets[0];
      out->end_bytes = offsets[1];
    } else {
      return TERN_ERROR(kCorrupt, "unknown key ", Quoted(key));
    }
  }
  TERN_REQUIRE(have_dtype && have_shape && have_offsets, kCorrupt,
               "needs \"dtype\", \"shape\" and \"data_offsets\"");
  return Status::Ok();
}

Status ParseMetadata(json::Reader& reader, std::map<std::string, std::string>* metadata) {
  TERN_REQUIRE(reader.Peek() == json::Reader::Kind::kObject, kCorrupt,
               "__metadata__ must be an object of strings");
  TERN_RETURN_IF_ERROR(reader.BeginObject());
  std::string key;
  while (true) {
    TERN_ASSIGN_OR_RETURN(bool more, reader.NextKey(&key));
    if (!more) return Status::Ok();
    TERN_REQUIRE(reader.Peek() == json::Reader::Kind::kString, kCorrupt, "__metadata__ value of ",
                 Quoted(key), " is not a string");
    TERN_ASSIGN_OR_RETURN(std::string value, reader.ReadString());
    TERN_REQUIRE(metadata->emplace(key, std::move(value)).second, kCorrupt,
                 "duplicate __metadata__ key ", Quoted(key));
  }
}

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

  json::Reader reader(text, /*depth_max=*/8);
  TERN_REQUIRE(reader.Peek() == json::Reader::Kind::kObject, kCorrupt,
               "header is not a JSON object");
  TERN_RETURN_IF_ERROR(reader.BeginObject());
  std::string key;
  while (true) {
    TERN_ASSIGN_OR_RETURN(bool more, reader.NextKey(&key));
    if (!more) break;
    if (key == "__metadata__") {
      TERN_REQUIRE(!header.has_metadata, kCorrupt, "duplicate __metadata__");
      header.has_metadata = true;
      TERN_RETURN_IF_ERROR(ParseMetadata(reader, &header.metadata));
      continue;
    }
    HeaderTensor tensor;
    Status s = ParseTensorInfo(reader, key, &tensor);
    if (!s.ok()) return s.WithContext("tensor " + Quoted(key));
    header.tensors.push_back(std::move(tensor));
  }
  TERN_RETURN_IF_ERROR(reader.Finish());
  TERN_RETURN_IF_ERROR(CheckLayout(header, file_bytes - kLengthBytes - n));
  return header;
}

std::string SerializeHeader(const std::map<std::string, std::string>& metadata,
                            std::span<const PlacedTensor> tensors) {
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) json += ',';
      first = false;
      json::AppendQuoted(k, &json);
      json += ':';
      json::AppendQuoted(v, &json);
    }
    json += '}';
    first = false;
  }
  for (const PlacedTensor& t : tensors) {
    if (!first) json += ',';
    first = false;
    json::AppendQuoted(t.desc->name, &json);
    json += ":{\"dtype\":\"";
    json += DTypeName(t.desc->dtype);
    json += "\",\"shape\":[";
    for (size_t i = 0; i < t.desc->shape.size(); ++i) {
      if (i) json += ',';
      json += std::to_string(t.desc->shape[i]);
    }
    json += "],\"data_offsets\":[";
    json += std::to_string(t.begin_bytes);
    json += ',';
    json += std::to_string(t.end_bytes);
    json += "]}";
  }
  json += '}';
  json.resize((json.size() + 7) / 8 * 8, ' ');
  std::string out(kLengthBytes, '\0');
  uint64_t n = json.size();
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + json;
}

}  // namespace tern::safetensors
