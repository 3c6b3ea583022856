// The `tern` subcommands. Each takes argv with argv[0] = the subcommand name,
// prints its own --help, and returns the process exit status (0 ok, 1 failed,
// 2 bad usage). Add a command: declare it here and list it in kCommands in
// tern_main.cc.
#pragma once

namespace tern::cli {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

}  // namespace tern::cli
