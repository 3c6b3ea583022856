// The verbs probe with the library name injectable, so tests can make the
// dlopen fail. ProbeVerbs() (tern/transport_probe.h) uses libibverbs.so.1.
#pragma once

#include <string>

#include "tern/transport_probe.h"

namespace tern::verbs {

BackendProbe ProbeVerbsLibrary(const std::string& soname);

}  // namespace tern::verbs
