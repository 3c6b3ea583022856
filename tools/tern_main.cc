// `tern`: one binary, one subcommand per job. main() is the only place that
// builds the process-wide dependencies (thread pool size, file system).
#include <cstdio>

#include "tools/commands.h"

int main(int argc, char** argv) {
  using namespace tern::cli;
  CLI::App tern("tern: ship bit-exact weight patches to RL rollout engines.", "tern");
  Configure(tern);
  tern.require_subcommand(1);
  tern.footer("tern COMMAND --help shows a command's flags; exit statuses: docs/cli.md.");
  Dispatch dispatch;

  CLI::App* version = tern.add_subcommand("version", "print the version");
  dispatch.On(version, {nullptr, [] {
                          std::printf("tern 0.1.0\n");
                          return tern::Status::Ok();
                        }});
  AddDemo(tern, dispatch);
  AddDatagen(tern, dispatch);
  AddDiff(tern, dispatch);
  AddApply(tern, dispatch);
  AddSquash(tern, dispatch);
  AddInspect(tern, dispatch);
  AddDigest(tern, dispatch);
  AddCast(tern, dispatch);
  AddXfer(tern, dispatch);
  AddTransports(tern, dispatch);
  AddAgent(tern, dispatch);
  AddKeys(tern, dispatch);
  // `tern help` is `tern --help` (not listed).
  CLI::App* help = tern.add_subcommand("help", "")->group("");
  dispatch.On(help, {nullptr, [&tern] {
                       std::fputs(tern.get_formatter()->make_help(&tern, "tern", CLI::AppFormatMode::Normal).c_str(), stdout);
                       return tern::Status::Ok();
                     }});
  return dispatch.Run(tern, argc, argv);
}
