// ViewOfTensors (agent/daemon/publish_tensors.h).
#include "agent/daemon/publish_tensors.h"

#include <algorithm>
#include <set>
#include <string>
#include <thread>

#include "tern/thread_pool.h"

namespace tern::agent {
namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status CheckOne(const PublishTensor& t, const char* who) {
  TERN_REQUIRE(!t.name.empty(), kInvalidArgument, who, ": a tensor has an empty name");
  TERN_REQUIRE(t.name.size() <= kMaxPublishTensorName, kInvalidArgument,
               who, ": a tensor name of ", t.name.size(), " bytes (at most ",
               kMaxPublishTensorName, ")");
  const std::string& n = t.name;
  TERN_REQUIRE(DTypeValid(static_cast<uint8_t>(t.dtype)), kInvalidArgument,
               who, ": tensor ", n, " has an unknown dtype code ",
               static_cast<int>(t.dtype));
  TERN_REQUIRE(t.shape.size() <= kMaxPublishTensorRank, kInvalidArgument, who, ": tensor ",
               n, " has ", t.shape.size(), " dimensions (at most ", kMaxPublishTensorRank, ")");
  auto elements = CheckedElements(t.dtype, t.shape);
  if (!elements.ok())
    return TERN_ERROR(kInvalidArgument, who, ": tensor ", n, " shape ", ShapeText(t.shape),
                      ": ", elements.status().message());
  const uint64_t want = DTypeBytes(t.dtype, *elements);
  TERN_REQUIRE(t.bytes == want, kInvalidArgument, who, ": tensor ", n, " has ", t.bytes,
               " bytes, but ", DTypeName(t.dtype), " ", ShapeText(t.shape), " is ", want, " bytes");
  TERN_REQUIRE(t.data != nullptr || t.bytes == 0, kInvalidArgument, who, ": tensor ", n,
               " has a null data pointer");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<BorrowedView>> ViewOfTensors(const std::vector<PublishTensor>& tensors,
                                                    const ServeView* served, const char* who) {
  TERN_REQUIRE(!tensors.empty(), kInvalidArgument, who, ": no tensors");
  TERN_REQUIRE(tensors.size() <= kMaxPublishTensors, kInvalidArgument, who, ": ",
               tensors.size(), " tensors (at most ", kMaxPublishTensors, ")");
  for (const PublishTensor& t : tensors) TERN_RETURN_IF_ERROR(CheckOne(t, who));
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  for (size_t i = 1; i < order.size(); ++i)
    TERN_REQUIRE(tensors[order[i]].name != tensors[order[i - 1]].name, kInvalidArgument,
                 who, ": tensor ", tensors[order[i]].name, " is given twice");
  if (served != nullptr) {
    // Both sorted by name: one merge finds the first difference.
    const auto& have = served->tensors;
    size_t i = 0, j = 0;
    while (i < order.size() || j < have.size()) {
      const PublishTensor* t = i < order.size() ? &tensors[order[i]] : nullptr;
      const TensorDesc* d = j < have.size() ? have[j].desc : nullptr;
      if (d == nullptr || (t != nullptr && t->name < d->name))
        return TERN_ERROR(kMismatch, who, ": tensor ", t->name,
                          " is not in the served layout (", have.size(), " tensors)");
      if (t == nullptr || d->name < t->name)
        return TERN_ERROR(kMismatch, who, ": tensor ", d->name,
                          " of the served layout is missing");
      TERN_REQUIRE(t->dtype == d->dtype, kMismatch, who, ": tensor ", t->name, " is ",
                   DTypeName(t->dtype), ", the served layout has ", DTypeName(d->dtype));
      TERN_REQUIRE(t->shape == d->shape, kMismatch, who, ": tensor ", t->name,
                   " has shape ", ShapeText(t->shape), ", the served layout has ",
                   ShapeText(d->shape));
      ++i;
      ++j;
    }
  }
  auto out = std::make_unique<BorrowedView>();
  out->descs.reserve(order.size());
  out->view.tensors.reserve(order.size());
  static constexpr uint8_t kEmpty = 0;
  for (size_t k : order) {
    const PublishTensor& t = tensors[k];
    out->descs.push_back({t.name, t.dtype, t.shape});
    const uint8_t* data = t.data != nullptr ? static_cast<const uint8_t*>(t.data) : &kEmpty;
    out->view.tensors.push_back({&out->descs.back(), data});
  }
  return out;
}

}  // namespace tern::agent

namespace tern {

Result<ViewDigest> DigestOfTensors(const std::vector<PublishTensor>& tensors, unsigned threads) {
  TERN_ASSIGN_OR_RETURN(auto view, agent::ViewOfTensors(tensors, nullptr, "view_digest"));
  if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  ThreadPool pool(threads);
  return ComputeDigest(view->view, pool);
}

}  // namespace tern
