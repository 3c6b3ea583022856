// libibverbs, loaded at run time with dlopen so that tern starts on machines
// without RDMA: no link-time dependency, <infiniband/verbs.h> is used for
// types only. Verbs that verbs.h implements inline (post_send, poll_cq,
// req_notify_cq) dispatch through the device context and need no symbol.
//
// Thread safety: an IbvApi is immutable after Load and may be shared; the
// library stays loaded until the last IbvApi is destroyed.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <string>
#include <vector>

#include "tern/status.h"

namespace tern::verbs {

struct IbvApi {
  // Member names differ from the C names: verbs.h defines some of those as
  // function-like macros.
  decltype(&::ibv_get_device_list) get_device_list = nullptr;
  decltype(&::ibv_free_device_list) free_device_list = nullptr;
  decltype(&::ibv_get_device_name) get_device_name = nullptr;
  decltype(&::ibv_open_device) open_device = nullptr;
  decltype(&::ibv_close_device) close_device = nullptr;
  decltype(&::ibv_query_device) query_device = nullptr;
  decltype(&::ibv_query_port) query_port = nullptr;
  decltype(&::ibv_query_gid) query_gid = nullptr;
  decltype(&::ibv_alloc_pd) alloc_pd = nullptr;
  decltype(&::ibv_dealloc_pd) dealloc_pd = nullptr;
  decltype(&::ibv_reg_mr) reg_mr = nullptr;
  decltype(&::ibv_dereg_mr) dereg_mr = nullptr;
  decltype(&::ibv_create_comp_channel) create_comp_channel = nullptr;
  decltype(&::ibv_destroy_comp_channel) destroy_comp_channel = nullptr;
  decltype(&::ibv_create_cq) create_cq = nullptr;
  decltype(&::ibv_destroy_cq) destroy_cq = nullptr;
  decltype(&::ibv_get_cq_event) get_cq_event = nullptr;
  decltype(&::ibv_ack_cq_events) ack_cq_events = nullptr;
  decltype(&::ibv_create_qp) create_qp = nullptr;
  decltype(&::ibv_modify_qp) modify_qp = nullptr;
  decltype(&::ibv_destroy_qp) destroy_qp = nullptr;
  decltype(&::ibv_wc_status_str) wc_status_str = nullptr;

  std::string soname;
  std::shared_ptr<void> handle;  // dlclose on release

  // dlopen(soname) and resolve every symbol above. kUnavailable names the
  // library and dlerror()'s reason, or the first missing symbol.
  static Result<std::shared_ptr<const IbvApi>> Load(const std::string& soname = "libibverbs.so.1");
};

// verbs.h's inline ibv_query_port, through our table: the extended op when
// the provider has one, else the exported compat symbol.
int QueryPort(const IbvApi& api, ibv_context* ctx, uint8_t port, ibv_port_attr* attr);

// One RDMA port as the probe and device selection see it.
struct PortInfo {
  std::string device;  // "mlx5_0"
  uint8_t port = 1;
  bool active = false;
  bool ethernet = false;  // RoCE (GID addressing) rather than InfiniBand (LID)
  uint16_t lid = 0;
  uint32_t active_mtu_bytes = 0;
};

// Every port of every device; empty when the library loads but finds none.
Result<std::vector<PortInfo>> ListPorts(const IbvApi& api);

// ibv's MTU enum to bytes (0 for an unknown value) and back (kInvalidArgument
// unless 256, 512, 1024, 2048 or 4096).
uint32_t MtuBytes(ibv_mtu mtu);
Result<ibv_mtu> MtuFromBytes(uint32_t bytes);

}  // namespace tern::verbs
