// `tern-agent`: the transfer agent daemon (docs/agent.md). The same flags
// as `tern agent`; a separate binary so that nodes can run it alone.
#include "tools/commands.h"

int main(int argc, char** argv) {
  using namespace tern::cli;
  CLI::App app(
      "tern-agent: keep this node's weights on the version the trainer published.\n"
      "  root:   tern-agent --root --listen HOST:PORT --data DIR [--admin HOST:PORT]\n"
      "  member: tern-agent --join HOST:PORT --listen HOST:PORT --region R --trust-key PEM --data DIR",
      "tern-agent");
  Configure(app);
  app.footer("Exit statuses: docs/cli.md. Stops on SIGINT/SIGTERM (a member says goodbye to the root).");
  Dispatch dispatch;
  AddAgentFlags(app, dispatch);
  return dispatch.Run(app, argc, argv);
}
