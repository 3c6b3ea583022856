#include "base/log.h"

#include <unistd.h>

#include <string>

namespace tern {
namespace {

void WriteStderr(std::string_view line) {
  std::string out(line);
  out.push_back('\n');
  // One write(2): lines from concurrent threads stay whole. A failed or
  // short write to stderr has nowhere better to be reported.
  (void)!::write(STDERR_FILENO, out.data(), out.size());
}

}  // namespace

LogFn StderrLog() { return WriteStderr; }

void LogLine(const LogFn& log, std::string_view line) {
  if (log) {
    log(line);
  } else {
    WriteStderr(line);
  }
}

}  // namespace tern
