#include "xfer/xfer_wire.h"

#include <algorithm>

#include "base/coding.h"
#include "base/text.h"
#include "base/wire_status.h"
#include "tern/transport.h"

namespace tern::xfer {

namespace {

// Reads little-endian fields after the type byte; every read is bounded by
// the message.
class Reader {
 public:
  explicit Reader(std::string_view m) : m_(m), pos_(m.empty() ? 0 : 1) {}
  Result<uint64_t> Int(int bytes) {
    TERN_REQUIRE(m_.size() - pos_ >= static_cast<size_t>(bytes), kCorrupt, "xfer message '",
                 TypeName(), "' truncated at byte ", pos_);
    const uint64_t v = DecodeFixedAt(m_, pos_, bytes);
    pos_ += bytes;
    return v;
  }
  // A u32 length, then that many bytes (at most max_bytes).
  Result<std::string_view> Bytes(uint64_t max_bytes) {
    TERN_ASSIGN_OR_RETURN(uint64_t n, Int(4));
    TERN_REQUIRE(n <= max_bytes && n <= m_.size() - pos_, kCorrupt, "xfer message '", TypeName(),
                 "' has a field of ", n, " bytes (at most ",
                 std::min<uint64_t>(max_bytes, m_.size() - pos_), " allowed)");
    std::string_view out = m_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  Status End() const {
    TERN_REQUIRE(pos_ == m_.size(), kCorrupt, "xfer message '", TypeName(), "' has ",
                 m_.size() - pos_, " trailing bytes");
    return Status::Ok();
  }

 private:
  std::string TypeName() const { return Printable(m_.substr(0, 1)); }
  std::string_view m_;
  size_t pos_;  // starts after the type byte
};

Status ExpectType(std::string_view m, char type) {
  TERN_REQUIRE(TypeOf(m) == type, kProtocol, "expected xfer message '", type, "', got '",
               Printable(m.substr(0, 1)), "' (", m.size(), " bytes)");
  return Status::Ok();
}

void PutBytes(std::string& out, std::string_view bytes) {
  PutFixed(&out, bytes.size(), 4);
  out.append(bytes);
}

}  // namespace

std::string EncodeGet(const GetRequest& get) {
  std::string out(1, kGet);
  PutFixed(&out, kVersion, 4);
  PutFixed(&out, get.chunk_bytes, 8);
  PutFixed(&out, get.transfer_id, 8);
  PutBytes(out, get.name);
  PutFixed(&out, get.have_size, 8);
  PutFixed(&out, get.have_tag, 8);
  PutBytes(out, get.have_bitmap);
  PutFixed(&out, get.head_bytes, 8);
  PutBytes(out, get.access_token);
  return out;
}

Result<GetRequest> DecodeGet(std::string_view m) {
  TERN_RETURN_IF_ERROR(ExpectType(m, kGet));
  Reader in(m);
  TERN_ASSIGN_OR_RETURN(uint64_t version, in.Int(4));
  TERN_REQUIRE(version == kVersion, kProtocol, "client speaks xfer version ", version,
               ", this side ", kVersion);
  GetRequest get;
  TERN_ASSIGN_OR_RETURN(get.chunk_bytes, in.Int(8));
  TERN_REQUIRE(get.chunk_bytes >= kMinChunkBytes && get.chunk_bytes <= kMaxChunkBytes, kOutOfRange,
               "chunk size ", get.chunk_bytes, " outside [", kMinChunkBytes, ", ", kMaxChunkBytes,
               "]");
  TERN_ASSIGN_OR_RETURN(get.transfer_id, in.Int(8));
  TERN_REQUIRE(get.transfer_id != 0, kCorrupt, "GET with transfer id 0");
  TERN_ASSIGN_OR_RETURN(std::string_view name, in.Bytes(kMaxNameBytes));
  TERN_ASSIGN_OR_RETURN(get.have_size, in.Int(8));
  TERN_ASSIGN_OR_RETURN(get.have_tag, in.Int(8));
  TERN_ASSIGN_OR_RETURN(std::string_view bitmap, in.Bytes(kMaxChunks / 8));
  TERN_ASSIGN_OR_RETURN(get.head_bytes, in.Int(8));
  TERN_ASSIGN_OR_RETURN(std::string_view token, in.Bytes(kMaxAccessTokenBytes));
  TERN_RETURN_IF_ERROR(in.End());
  TERN_REQUIRE(get.head_bytes == 0 || (get.have_tag == 0 && get.head_bytes % get.chunk_bytes == 0 &&
                                       get.head_bytes <= kMaxHeadBytes),
               kCorrupt, "GET with a head window of ", get.head_bytes,
               " bytes (a chunk multiple up to ", kMaxHeadBytes, ", only without a held version)");
  if (get.have_tag == 0) {
    TERN_REQUIRE(get.have_size == 0 && bitmap.empty(), kCorrupt,
                 "GET without a held version carries a size or bitmap");
  } else {
    TERN_ASSIGN_OR_RETURN(uint64_t chunks, ChunkCount(get.have_size, get.chunk_bytes));
    TERN_RETURN_IF_ERROR(CheckBitmap(bitmap, chunks));
  }
  // Well-formed but unusable: the client's mistake, not to be retried.
  TERN_REQUIRE(!name.empty() && name.find('\0') == std::string_view::npos, kInvalidArgument,
               "bad file name");
  get.name.assign(name);
  get.have_bitmap.assign(bitmap);
  get.access_token.assign(token);
  return get;
}

std::string EncodeInfo(const Info& info) {
  std::string out(1, kInfo);
  PutFixed(&out, info.size_bytes, 8);
  PutFixed(&out, info.tag, 8);
  PutFixed(&out, info.transfer_id, 8);
  PutFixed(&out, info.flags, 1);
  PutFixed(&out, info.xxh3, 8);
  return out;
}

Result<Info> DecodeInfo(std::string_view m) {
  TERN_RETURN_IF_ERROR(ExpectType(m, kInfo));
  Reader in(m);
  Info info;
  TERN_ASSIGN_OR_RETURN(info.size_bytes, in.Int(8));
  TERN_ASSIGN_OR_RETURN(info.tag, in.Int(8));
  TERN_ASSIGN_OR_RETURN(info.transfer_id, in.Int(8));
  TERN_ASSIGN_OR_RETURN(uint64_t flags, in.Int(1));
  TERN_ASSIGN_OR_RETURN(info.xxh3, in.Int(8));
  TERN_RETURN_IF_ERROR(in.End());
  TERN_REQUIRE(info.tag != 0 && info.transfer_id != 0, kCorrupt, "INFO with a zero tag or transfer id");
  TERN_REQUIRE((flags & ~uint64_t{kInfoHashKnown | kInfoSending | kInfoHead}) == 0, kCorrupt,
               "INFO with unknown flags 0x", std::hex, flags);
  TERN_REQUIRE((flags & (kInfoSending | kInfoHead)) != (kInfoSending | kInfoHead), kCorrupt,
               "INFO both resuming and sending a head");
  info.flags = static_cast<uint8_t>(flags);
  TERN_REQUIRE(info.hash_known() || info.xxh3 == 0, kCorrupt, "INFO with a hash not flagged as known");
  return info;
}

std::string EncodeHash(const HashMsg& hash) {
  std::string out(1, kHash);
  PutFixed(&out, hash.transfer_id, 8);
  PutFixed(&out, hash.xxh3, 8);
  return out;
}

Result<HashMsg> DecodeHash(std::string_view m) {
  TERN_RETURN_IF_ERROR(ExpectType(m, kHash));
  Reader in(m);
  HashMsg hash;
  TERN_ASSIGN_OR_RETURN(hash.transfer_id, in.Int(8));
  TERN_ASSIGN_OR_RETURN(hash.xxh3, in.Int(8));
  TERN_RETURN_IF_ERROR(in.End());
  return hash;
}

std::string EncodeWant(uint64_t transfer_id, std::string_view bitmap) {
  std::string out(1, kWant);
  PutFixed(&out, transfer_id, 8);
  PutBytes(out, bitmap);
  return out;
}

Result<Want> DecodeWant(std::string_view m, uint64_t max_bitmap_bytes) {
  TERN_RETURN_IF_ERROR(ExpectType(m, kWant));
  Reader in(m);
  Want want;
  TERN_ASSIGN_OR_RETURN(want.transfer_id, in.Int(8));
  TERN_REQUIRE(want.transfer_id != 0, kCorrupt, "WANT with transfer id 0");
  TERN_ASSIGN_OR_RETURN(std::string_view bits, in.Bytes(max_bitmap_bytes));
  TERN_RETURN_IF_ERROR(in.End());
  want.bitmap.assign(bits);
  return want;
}

std::string EncodeStatus(char type, const Status& status) {
  std::string out(1, type);
  PutFixed16(&out, WireCode(status));
  PutBytes(out, std::string_view(status.message()).substr(0, kMaxReasonBytes));
  return out;
}

Status DecodeStatus(std::string_view m, char type, Status* verdict) {
  TERN_RETURN_IF_ERROR(ExpectType(m, type));
  Reader in(m);
  TERN_ASSIGN_OR_RETURN(uint64_t code, in.Int(2));
  TERN_ASSIGN_OR_RETURN(std::string_view reason, in.Bytes(kMaxReasonBytes));
  TERN_RETURN_IF_ERROR(in.End());
  *verdict = StatusFromWire(code, "server", reason);
  return Status::Ok();
}

Result<uint64_t> ChunkCount(uint64_t size_bytes, uint64_t chunk_bytes) {
  TERN_REQUIRE(chunk_bytes >= kMinChunkBytes && chunk_bytes <= kMaxChunkBytes, kOutOfRange,
               "chunk size ", chunk_bytes, " outside [", kMinChunkBytes, ", ", kMaxChunkBytes, "]");
  const uint64_t chunks = size_bytes / chunk_bytes + (size_bytes % chunk_bytes != 0);
  TERN_REQUIRE(chunks <= kMaxChunks, kOutOfRange, "a file of ", size_bytes, " bytes needs ", chunks,
               " chunks of ", chunk_bytes, " bytes, more than ", kMaxChunks, "; use larger chunks");
  return chunks;
}

Status CheckBitmap(std::string_view bitmap, uint64_t chunks) {
  TERN_REQUIRE(bitmap.size() == (chunks + 7) / 8, kCorrupt, "chunk bitmap of ", bitmap.size(),
               " bytes, expected ", (chunks + 7) / 8);
  if (chunks % 8 != 0) {
    const uint8_t spare = static_cast<uint8_t>(0xFF << (chunks % 8));
    TERN_REQUIRE((static_cast<uint8_t>(bitmap.back()) & spare) == 0, kCorrupt,
                 "chunk bitmap has bits past the last chunk");
  }
  return Status::Ok();
}

namespace {

std::string Hex16(uint64_t v) {
  static const char* kHex = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[i] = kHex[(v >> (60 - 4 * i)) & 15];
  return out;
}

Result<uint64_t> Number(std::string_view s) {
  Result<uint64_t> v = ParseDecimal(s);
  TERN_REQUIRE(v.ok(), kCorrupt, "resume state field: ", v.status().message());
  return v;
}

// Exactly 16 hex digits.
Result<uint64_t> ParseHex16(std::string_view s, const char* what) {
  TERN_REQUIRE(s.size() == 16, kCorrupt, "resume state ", what, " of ", s.size(),
               " hex digits, expected 16");
  uint8_t bytes[8];
  TERN_REQUIRE(ParseHex(s, bytes), kCorrupt, "resume state ", what, " is not hex");
  uint64_t v = 0;
  for (uint8_t b : bytes) v = (v << 8) | b;
  return v;
}

}  // namespace

std::string FormatPartState(const PartState& st) {
  const std::string hex =
      Hex({reinterpret_cast<const uint8_t*>(st.bitmap.data()), st.bitmap.size()});
  return "tern-part 2 " + std::to_string(st.size_bytes) + " " + Hex16(st.tag) + " " +
         (st.hash_known ? Hex16(st.xxh3) : "-") + " " + std::to_string(st.chunk_bytes) + " " +
         (hex.empty() ? "-" : hex) + "\n";
}

Result<PartState> ParsePartState(std::string_view text) {
  // Bounded before anything is split or allocated: the largest valid line.
  constexpr uint64_t kMaxLineBytes = kMaxPartStateBytes;
  TERN_REQUIRE(text.size() <= kMaxLineBytes, kCorrupt, "resume state of ", text.size(),
               " bytes is too long");
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  constexpr size_t kFields = 7;
  std::string_view fields[kFields];
  size_t n = 0;
  while (n < kFields) {
    const size_t space = text.find(' ');
    fields[n++] = text.substr(0, space);
    if (space == std::string_view::npos) {
      text = {};
      break;
    }
    text.remove_prefix(space + 1);
  }
  TERN_REQUIRE(n >= 2 && fields[0] == "tern-part" && fields[1] == "2", kCorrupt,
               "not a version 2 tern-part resume state");
  TERN_REQUIRE(n == kFields && text.empty(), kCorrupt,
               "resume state is not 'tern-part 2 SIZE TAG XXH3 CHUNK BITMAP'");
  PartState st;
  TERN_ASSIGN_OR_RETURN(st.size_bytes, Number(fields[2]));
  TERN_ASSIGN_OR_RETURN(st.tag, ParseHex16(fields[3], "tag"));
  TERN_REQUIRE(st.tag != 0, kCorrupt, "resume state with a zero tag");
  if (fields[4] != "-") {
    TERN_ASSIGN_OR_RETURN(st.xxh3, ParseHex16(fields[4], "checksum"));
    st.hash_known = true;
  }
  TERN_ASSIGN_OR_RETURN(st.chunk_bytes, Number(fields[5]));
  auto chunks = ChunkCount(st.size_bytes, st.chunk_bytes);
  TERN_REQUIRE(chunks.ok(), kCorrupt, "resume state: ", chunks.status().message());
  const std::string_view hex = fields[6] == "-" ? std::string_view() : fields[6];
  TERN_REQUIRE(hex.size() == 2 * ((*chunks + 7) / 8), kCorrupt, "resume state bitmap of ",
               hex.size(), " hex digits, expected ", 2 * ((*chunks + 7) / 8));
  st.bitmap.resize(hex.size() / 2);
  TERN_REQUIRE(ParseHex(hex, {reinterpret_cast<uint8_t*>(st.bitmap.data()), st.bitmap.size()}),
               kCorrupt, "resume state bitmap is not hex");
  TERN_RETURN_IF_ERROR(CheckBitmap(st.bitmap, *chunks).WithContext("resume state"));
  return st;
}

}  // namespace tern::xfer
