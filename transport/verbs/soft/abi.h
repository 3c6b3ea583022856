// Shared by softverbs' ABI files: the handle casts (every ibv_* object we
// hand out is the first member of ours), the export macro, and the queue-pair
// ops the context table points at.
#pragma once

#include <cerrno>
#include <cstddef>

#include "transport/verbs/soft/fabric.h"

#define SOFTVERBS_EXPORT extern "C" __attribute__((visibility("default")))

namespace tern::softverbs {

inline Ctx* CtxOf(ibv_context* c) {
  return reinterpret_cast<Ctx*>(reinterpret_cast<uint8_t*>(c) - offsetof(verbs_context, context));
}
inline Pd* PdOf(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
inline Mr* MrOf(ibv_mr* m) { return reinterpret_cast<Mr*>(m); }
inline Cq* CqOf(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline Channel* ChannelOf(ibv_comp_channel* c) { return reinterpret_cast<Channel*>(c); }
inline Qp* QpOf(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }

template <class T>
T* Fail(int err) {
  errno = err;
  return nullptr;
}

inline constexpr unsigned kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                         IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// ctx->ops.post_send / post_recv (qp_abi.cc).
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

}  // namespace tern::softverbs
