// NcclIsland (include/tern/gpu.h): NCCL loaded at run time with dlopen, like
// libibverbs in transport/verbs/, so binaries run where NCCL is absent. The
// few entry points used are declared here with NCCL 2's stable C ABI
// (nccl.h: ncclResult_t is an int enum, ncclUniqueId 128 bytes, ncclUint8
// = 1), so no NCCL header is needed to build.
#include <dlfcn.h>

#include <cstring>
#include <mutex>

#include "tern/gpu.h"

namespace tern {
namespace {

constexpr int kNcclSuccess = 0;
constexpr int kNcclUint8 = 1;
constexpr int kNcclUint64 = 5;
constexpr int kNcclSum = 0;
struct NcclUniqueId {
  char internal[128];
};

struct NcclApi {
  int (*get_version)(int*) = nullptr;
  int (*get_unique_id)(NcclUniqueId*) = nullptr;
  int (*comm_init_rank)(void** comm, int nranks, NcclUniqueId id, int rank) = nullptr;
  int (*comm_destroy)(void* comm) = nullptr;
  int (*broadcast)(const void* send, void* recv, size_t count, int datatype, int root, void* comm,
                   void* stream) = nullptr;
  int (*all_reduce)(const void* send, void* recv, size_t count, int datatype, int op, void* comm,
                    void* stream) = nullptr;
  const char* (*error_string)(int) = nullptr;
  std::string error;  // why loading failed
};

// Loaded once per process and never unloaded (NCCL keeps threads alive).
// The one process-wide state of the GPU path: a library handle, as dlopen
// itself is process-wide.
const NcclApi& Nccl() {
  static NcclApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      api.error = std::string("libnccl.so.2 not loadable: ") + dlerror();
      return;
    }
    auto sym = [&](const char* name) {
      void* s = dlsym(lib, name);
      if (s == nullptr && api.error.empty()) api.error = std::string("libnccl.so.2 lacks ") + name;
      return s;
    };
    api.get_version = reinterpret_cast<decltype(api.get_version)>(sym("ncclGetVersion"));
    api.get_unique_id = reinterpret_cast<decltype(api.get_unique_id)>(sym("ncclGetUniqueId"));
    api.comm_init_rank = reinterpret_cast<decltype(api.comm_init_rank)>(sym("ncclCommInitRank"));
    api.comm_destroy = reinterpret_cast<decltype(api.comm_destroy)>(sym("ncclCommDestroy"));
    api.broadcast = reinterpret_cast<decltype(api.broadcast)>(sym("ncclBroadcast"));
    api.all_reduce = reinterpret_cast<decltype(api.all_reduce)>(sym("ncclAllReduce"));
    api.error_string = reinterpret_cast<decltype(api.error_string)>(sym("ncclGetErrorString"));
  });
  return api;
}

Status Loaded() {
  TERN_REQUIRE(Nccl().error.empty(), kUnavailable, "NCCL: ", Nccl().error);
  return Status::Ok();
}

Status NcclStatus(int r, const char* what) {
  if (r == kNcclSuccess) return Status::Ok();
  return TERN_ERROR(kUnavailable, "NCCL ", what, ": ", Nccl().error_string(r), " (", r, ")");
}

}  // namespace

Result<int> NcclIsland::LibraryVersion() {
  TERN_RETURN_IF_ERROR(Loaded());
  int v = 0;
  TERN_RETURN_IF_ERROR(NcclStatus(Nccl().get_version(&v), "ncclGetVersion"));
  return v;
}

Result<std::vector<uint8_t>> NcclIsland::NewUniqueId() {
  TERN_RETURN_IF_ERROR(Loaded());
  NcclUniqueId id;
  TERN_RETURN_IF_ERROR(NcclStatus(Nccl().get_unique_id(&id), "ncclGetUniqueId"));
  return std::vector<uint8_t>(reinterpret_cast<uint8_t*>(id.internal), reinterpret_cast<uint8_t*>(id.internal) + 128);
}

Result<NcclIsland> NcclIsland::Join(int nranks, int rank, std::span<const uint8_t> unique_id) {
  TERN_REQUIRE(nranks >= 1 && rank >= 0 && rank < nranks, kInvalidArgument, "rank ", rank, " of ", nranks);
  TERN_REQUIRE(unique_id.size() == sizeof(NcclUniqueId), kInvalidArgument, "an NCCL unique id has 128 bytes, got ",
               unique_id.size());
  TERN_RETURN_IF_ERROR(Loaded());
  NcclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof(id));
  void* comm = nullptr;
  TERN_RETURN_IF_ERROR(NcclStatus(Nccl().comm_init_rank(&comm, nranks, id, rank), "ncclCommInitRank"));
  return NcclIsland(comm, nranks, rank);
}

NcclIsland::NcclIsland(NcclIsland&& o) noexcept : comm_(o.comm_), nranks_(o.nranks_), rank_(o.rank_) {
  o.comm_ = nullptr;
}
NcclIsland& NcclIsland::operator=(NcclIsland&& o) noexcept {
  if (this != &o) {
    if (comm_ != nullptr) Nccl().comm_destroy(comm_);
    comm_ = o.comm_;
    nranks_ = o.nranks_;
    rank_ = o.rank_;
    o.comm_ = nullptr;
  }
  return *this;
}
NcclIsland::~NcclIsland() {
  if (comm_ != nullptr) Nccl().comm_destroy(comm_);
}

Status NcclIsland::Broadcast(void* device_buffer, uint64_t bytes, int root, void* stream) {
  TERN_REQUIRE(comm_ != nullptr, kInvalidArgument, "NCCL island was moved from");
  TERN_REQUIRE(root >= 0 && root < nranks_, kInvalidArgument, "root ", root, " of ", nranks_);
  return NcclStatus(Nccl().broadcast(device_buffer, device_buffer, bytes, kNcclUint8, root, comm_, stream),
                    "ncclBroadcast");
}

Status NcclIsland::AllReduceSum(uint64_t* device_buffer, uint64_t count, void* stream) {
  TERN_REQUIRE(comm_ != nullptr, kInvalidArgument, "NCCL island was moved from");
  return NcclStatus(Nccl().all_reduce(device_buffer, device_buffer, count, kNcclUint64, kNcclSum, comm_, stream),
                    "ncclAllReduce");
}

}  // namespace tern
