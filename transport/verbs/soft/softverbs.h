// Fault knobs and counters of softverbs, the in-process emulated RDMA device
// (libtern_softverbs.so; docs/transport-rdma.md, "Testing without a device:
// softverbs"). Tests resolve these with dlsym on the handle that loaded the
// library; nothing links them. Plain C so any test can declare them.
//
// Thread safety: both functions may be called from any thread at any time.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tern_softverbs_counters {
  uint64_t bytes_moved;       // payload bytes copied by SEND, WRITE and READ
  uint64_t wrs_executed;      // send WRs that completed successfully
  uint64_t rnr_waits;         // receiver-not-ready retries (1 ms each)
  uint64_t retries_exceeded;  // WRs failed with IBV_WC_RETRY_EXC_ERR
  uint64_t cq_overruns;       // completions dropped because a CQ was full
};

// As if the link under QP `qpn` died: the QP moves to ERR and every posted
// WR completes with IBV_WC_WR_FLUSH_ERR; its peer then sees retry-exceeded
// errors. Returns 0, or ENOENT when no QP has that number.
typedef int (*tern_softverbs_break_qp_fn)(uint32_t qpn);
int tern_softverbs_break_qp(uint32_t qpn);

// Counters since the library was loaded. Returns 0, or EINVAL for NULL.
typedef int (*tern_softverbs_stats_fn)(struct tern_softverbs_counters* out);
int tern_softverbs_stats(struct tern_softverbs_counters* out);

#ifdef __cplusplus
}
#endif
