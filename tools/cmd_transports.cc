// tern transports: which transport backends work on this machine, and why
// the others do not (run-time probe; see tern/transport_registry.h).
#include <cstdio>
#include <string>

#include "tern/transport_registry.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern::cli {

void AddTransports(CLI::App& tern, Dispatch& dispatch) {
  CLI::App* cmd = tern.add_subcommand(
      "transports", "probe which transport backends (verbs, ucx, tcp) work here");
  cmd->footer(
      "Probes the transport backends (verbs, ucx, tcp, loopback) at run time and prints which "
      "are available here, with what was found or why not. Exit status 0.");
  dispatch.On(cmd, {nullptr, [] {
                      for (const BackendProbe& p : ProbeTransports()) {
                        std::printf("%-9s %-12s %s\n", p.backend.c_str(),
                                    p.available ? "available" : "unavailable", p.detail.c_str());
                      }
                      return Status::Ok();
                    }});
}

}  // namespace tern::cli
