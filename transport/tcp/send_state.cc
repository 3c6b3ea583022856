// TCP_INFO's pacing rate and unsent bytes are in the kernel's struct
// tcp_info (<linux/tcp.h>), not in the C library's older copy
// (<netinet/tcp.h>), and the two headers cannot meet in one file.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "transport/tcp/pipe.h"

namespace tern::tcp {

bool ReadSendState(int fd, SendState* out) {
  struct tcp_info info {};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  // Older kernels fill a shorter struct; the fields read must be inside it.
  const auto need = [&](const void* field, size_t size) {
    return static_cast<const char*>(field) + size <= reinterpret_cast<const char*>(&info) + len;
  };
  if (!need(&info.tcpi_pacing_rate, sizeof info.tcpi_pacing_rate) ||
      !need(&info.tcpi_notsent_bytes, sizeof info.tcpi_notsent_bytes)) {
    return false;
  }
  // ~0 is the kernel's "no pacing rate yet".
  out->pacing_bytes_per_s = info.tcpi_pacing_rate == ~uint64_t{0} ? 0 : info.tcpi_pacing_rate;
  out->notsent_bytes = info.tcpi_notsent_bytes;
  return true;
}

}  // namespace tern::tcp
