// The `tern` subcommands. Each Add<Name> declares its command on the root
// app (flags bound to a struct it owns) and registers its steps with the
// dispatch; tern_main.cc lists them. Exit statuses: docs/cli.md.
#pragma once

#include <CLI/CLI.hpp>

#include "tools/cli_args.h"

namespace tern::cli {

void AddDemo(CLI::App& tern, Dispatch& dispatch);
void AddDatagen(CLI::App& tern, Dispatch& dispatch);
void AddDiff(CLI::App& tern, Dispatch& dispatch);
void AddApply(CLI::App& tern, Dispatch& dispatch);
void AddSquash(CLI::App& tern, Dispatch& dispatch);
void AddInspect(CLI::App& tern, Dispatch& dispatch);
void AddDigest(CLI::App& tern, Dispatch& dispatch);
void AddCast(CLI::App& tern, Dispatch& dispatch);
void AddXfer(CLI::App& tern, Dispatch& dispatch);
void AddTransports(CLI::App& tern, Dispatch& dispatch);
// tern agent / tern publish / tern status (cmd_agent.cc).
void AddAgent(CLI::App& tern, Dispatch& dispatch);
// tern keys rotate / show / id: signed key sets (cmd_keys.cc).
void AddKeys(CLI::App& tern, Dispatch& dispatch);
// The daemon's flags on `cmd` (tern-agent's root app, or `tern agent`).
void AddAgentFlags(CLI::App& cmd, Dispatch& dispatch);

}  // namespace tern::cli
