// A trace step as a safetensors checkpoint (include/tern/datagen.h).
#include <algorithm>
#include <cstring>

#include "tern/checkpoint.h"
#include "tern/datagen.h"
#include "tern/thread_pool.h"

namespace tern {

Status WriteTraceCheckpoint(const TraceGenerator& gen, const std::string& path,
                    const std::map<std::string, std::string>& base_metadata,
                    const CreateOptions& options, ThreadPool& pool) {
  const ServeView& view = gen.view();
  std::vector<TensorDesc> descs;
  descs.reserve(view.tensors.size());
  for (const auto& t : view.tensors) descs.push_back(*t.desc);
  SortLikeReferenceWriter(descs);
  std::map<std::string, std::string> metadata = base_metadata;
  metadata["tern.trace.step"] = std::to_string(gen.step());
  TERN_ASSIGN_OR_RETURN(auto ckpt, WritableCheckpoint::Create(path, std::move(descs), metadata, options));
  MutableServeView& out = ckpt->view();
  TERN_REQUIRE(out.tensors.size() == view.tensors.size(), kInternal, "checkpoint has ",
               out.tensors.size(), " tensors, the view ", view.tensors.size());
  // Copy in 16 MiB pieces so a few huge tensors still spread over the pool.
  constexpr uint64_t kPieceBytes = uint64_t{16} << 20;
  struct Piece {
    const uint8_t* from;
    uint8_t* to;
    uint64_t bytes;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < view.tensors.size(); ++i) {
    const TensorRef& src = view.tensors[i];
    const MutableTensorRef& dst = out.tensors[i];
    TERN_REQUIRE(src.desc->SameLayout(*dst.desc), kInternal, "checkpoint tensor ",
                 dst.desc->name, " does not match the view's ", src.desc->name);
    const uint64_t bytes = src.desc->bytes();
    for (uint64_t at = 0; at < bytes; at += kPieceBytes)
      pieces.push_back(Piece{src.data + at, dst.data + at, std::min(kPieceBytes, bytes - at)});
  }
  pool.ParallelFor(pieces.size(), [&](uint64_t i) {
    std::memcpy(pieces[i].to, pieces[i].from, pieces[i].bytes);
  });
  const std::string config = gen.config_json();
  TERN_RETURN_IF_ERROR(ckpt->AddFile(
      "config.json", {reinterpret_cast<const uint8_t*>(config.data()), config.size()}));
  return ckpt->Commit();
}

}  // namespace tern
