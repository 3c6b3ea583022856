#include "transport/verbs/ibv_api.h"

#include <dlfcn.h>

#include <cstring>

namespace tern::verbs {

namespace {

template <class Fn>
Status Resolve(void* handle, const std::string& soname, const char* name, Fn* out) {
  dlerror();
  void* sym = dlsym(handle, name);
  TERN_REQUIRE(sym != nullptr, kUnavailable, "verbs: ", soname, " lacks ", name);
  *out = reinterpret_cast<Fn>(sym);
  return Status::Ok();
}

}  // namespace

int QueryPort(const IbvApi& api, ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx == nullptr) {
    std::memset(attr, 0, sizeof(*attr));
    return api.query_port(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
  }
  return vctx->query_port(ctx, port, attr, sizeof(*attr));
}

Result<std::shared_ptr<const IbvApi>> IbvApi::Load(const std::string& soname) {
  void* raw = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (raw == nullptr) {
    const char* why = dlerror();
    return TERN_ERROR(kUnavailable, "verbs: cannot load ", soname, ": ", why ? why : "unknown error");
  }
  auto api = std::make_shared<IbvApi>();
  api->soname = soname;
  api->handle = std::shared_ptr<void>(raw, [](void* h) { dlclose(h); });
#define TERN_IBV_RESOLVE(member, symbol) \
  TERN_RETURN_IF_ERROR(Resolve(raw, soname, #symbol, &api->member))
  TERN_IBV_RESOLVE(get_device_list, ibv_get_device_list);
  TERN_IBV_RESOLVE(free_device_list, ibv_free_device_list);
  TERN_IBV_RESOLVE(get_device_name, ibv_get_device_name);
  TERN_IBV_RESOLVE(open_device, ibv_open_device);
  TERN_IBV_RESOLVE(close_device, ibv_close_device);
  TERN_IBV_RESOLVE(query_device, ibv_query_device);
  TERN_IBV_RESOLVE(query_port, ibv_query_port);
  TERN_IBV_RESOLVE(query_gid, ibv_query_gid);
  TERN_IBV_RESOLVE(alloc_pd, ibv_alloc_pd);
  TERN_IBV_RESOLVE(dealloc_pd, ibv_dealloc_pd);
  TERN_IBV_RESOLVE(reg_mr, ibv_reg_mr);
  TERN_IBV_RESOLVE(dereg_mr, ibv_dereg_mr);
  TERN_IBV_RESOLVE(create_comp_channel, ibv_create_comp_channel);
  TERN_IBV_RESOLVE(destroy_comp_channel, ibv_destroy_comp_channel);
  TERN_IBV_RESOLVE(create_cq, ibv_create_cq);
  TERN_IBV_RESOLVE(destroy_cq, ibv_destroy_cq);
  TERN_IBV_RESOLVE(get_cq_event, ibv_get_cq_event);
  TERN_IBV_RESOLVE(ack_cq_events, ibv_ack_cq_events);
  TERN_IBV_RESOLVE(create_qp, ibv_create_qp);
  TERN_IBV_RESOLVE(modify_qp, ibv_modify_qp);
  TERN_IBV_RESOLVE(destroy_qp, ibv_destroy_qp);
  TERN_IBV_RESOLVE(wc_status_str, ibv_wc_status_str);
#undef TERN_IBV_RESOLVE
  return std::shared_ptr<const IbvApi>(std::move(api));
}

Result<std::vector<PortInfo>> ListPorts(const IbvApi& api) {
  int count = 0;
  ibv_device** devices = api.get_device_list(&count);
  if (devices == nullptr) {
    // ENOSYS / no kernel support reads as "no devices" to callers.
    return std::vector<PortInfo>{};
  }
  std::vector<PortInfo> ports;
  Status status;
  for (int d = 0; d < count && status.ok(); ++d) {
    const std::string name = api.get_device_name(devices[d]);
    ibv_context* ctx = api.open_device(devices[d]);
    if (ctx == nullptr) {
      status = TERN_ERRNO("verbs: opening ", name);
      break;
    }
    ibv_device_attr dev{};
    if (api.query_device(ctx, &dev) == 0) {
      for (uint8_t p = 1; p <= dev.phys_port_cnt; ++p) {
        ibv_port_attr attr{};
        if (QueryPort(api, ctx, p, &attr) != 0) continue;
        ports.push_back(PortInfo{name, p, attr.state == IBV_PORT_ACTIVE,
                                 attr.link_layer == IBV_LINK_LAYER_ETHERNET, attr.lid,
                                 MtuBytes(attr.active_mtu)});
      }
    }
    api.close_device(ctx);
  }
  api.free_device_list(devices);
  TERN_RETURN_IF_ERROR(status);
  return ports;
}

uint32_t MtuBytes(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
  }
  return 0;
}

Result<ibv_mtu> MtuFromBytes(uint32_t bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
  }
  return TERN_ERROR(kInvalidArgument, "verbs: MTU of ", bytes, " bytes is not an InfiniBand MTU");
}

}  // namespace tern::verbs
