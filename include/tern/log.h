// Logging at the library boundary (docs/logging.md). tern's libraries have
// no logger of their own and no global one: a component that has something
// to say and no caller to say it to (a server refusing a peer, a backend
// dropping a broken connection) takes a LogFn in its options and calls it
// with one line, "<component>: <what happened>", e.g.
// "tcp: rejected 127.0.0.1:5312: bad magic". Errors a caller can act on are
// returned as Status, never only logged. The program (the tern CLI, later
// the agent, or an engine embedding tern) decides where lines go.
//
// A null LogFn means StderrLog(). The function may be called from any
// backend thread at once and must not block for long.
#pragma once

#include <functional>
#include <string_view>

#include "tern/export.h"

namespace tern {

using LogFn = std::function<void(std::string_view line)>;

// Writes each line, newline-terminated, to stderr with one write call (lines
// from threads do not interleave).
TERN_EXPORT LogFn StderrLog();

}  // namespace tern
