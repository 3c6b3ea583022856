// `tern`: one binary, one subcommand per job. main() is the only place that
// builds the process-wide dependencies (thread pool size, file system).
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/commands.h"

namespace tern::cli {

int RunDatagen(int argc, char** argv);
int RunDiff(int argc, char** argv);
int RunApply(int argc, char** argv);
int RunSquash(int argc, char** argv);
int RunInspect(int argc, char** argv);
int RunDigest(int argc, char** argv);
int RunDemo(int argc, char** argv);
int RunCast(int argc, char** argv);
int RunXfer(int argc, char** argv);
int RunTransports(int argc, char** argv);

namespace {
int RunVersionImpl(int, char**) {
  std::printf("tern 0.1.0\n");
  return 0;
}

const Command kCommands[] = {
    {"version", "print the version", RunVersionImpl},
    {"demo", "run the codec end to end on a simulated RL run", RunDemo},
    {"datagen", "write an RL trace of serve-view checkpoints", RunDatagen},
    {"diff", "make a patch between two checkpoints", RunDiff},
    {"apply", "apply a patch to a checkpoint (staged, verified)", RunApply},
    {"squash", "join consecutive patches into one", RunSquash},
    {"inspect", "show what a patch holds", RunInspect},
    {"digest", "print a checkpoint's view digest", RunDigest},
    {"cast", "quantize a checkpoint into a serve layout (fp8, nvfp4, mxfp4, int4)", RunCast},
    {"xfer", "copy a file over multi-stream TCP/TLS with resume (serve | get)", RunXfer},
    {"transports", "probe which transport backends (verbs, ucx, tcp) work here", RunTransports},
};

void Usage(FILE* out) {
  std::fprintf(out, "usage: tern COMMAND [args]   (tern COMMAND --help for details)\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
}
}  // namespace
}  // namespace tern::cli

int main(int argc, char** argv) {
  using namespace tern::cli;
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    Usage(stdout);
    return 0;
  }
  for (const Command& c : kCommands)
    if (name == c.name) return c.run(argc - 1, argv + 1);
  std::fprintf(stderr, "tern: unknown command '%s'\n", name.c_str());
  Usage(stderr);
  return 2;
}
