// What libraries call to log: the LogFn they were given, or StderrLog() when
// it is null (tern/log.h).
#pragma once

#include <string_view>

#include "tern/log.h"

namespace tern {

void LogLine(const LogFn& log, std::string_view line);

}  // namespace tern
