// tern transports: which transport backends work on this machine, and why
// the others do not (run-time probe; see tern/transport_probe.h).
#include <cstdio>
#include <string>

#include "tern/transport_probe.h"
#include "tools/cli_util.h"
#include "tools/flags.h"

namespace tern::cli {

int RunTransports(int argc, char** argv) {
  Flags flags("transports",
              "Probe the transport backends (verbs, ucx, tcp, loopback) at run time and print "
              "which are available here, with what was found or why not. Exit status 0.");
  Status s = flags.Parse(argc, argv);
  if (s.ok()) {
    for (const BackendProbe& p : ProbeTransports()) {
      std::printf("%-9s %-12s %s\n", p.backend.c_str(), p.available ? "available" : "unavailable",
                  p.detail.c_str());
    }
  }
  return Report("transports", s);
}

}  // namespace tern::cli
