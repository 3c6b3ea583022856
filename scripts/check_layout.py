#!/usr/bin/env python3
"""Checks tern's dependency rule (docs/architecture.md) on every #include.

    tools/ capi/ python/  ->  agent/  ->  domain modules  ->  transport  ->  base/
    (domain: xfer/ patch/ quant/ checkpoint/ topology/ gpu/ datagen/)

Fails (exit 1, one line per violation) when
  backend  a backend header (include/tern/<b>_transport.h, transport/<b>/*.h)
           is included from outside transport/registry/ and that backend's
           own folder (tests, the conformance suite, fuzzers and benchmarks
           excepted: TEST_SUPPORT below);
  sibling  a backend (transport/<b>/) includes another backend's folder or
           header, tests included: shared helpers move down to transport/net/
           or transport/*.h;
  layer    a file includes a module of a higher layer (base must not include
           transport, transport must not include xfer, a domain module must
           not include agent/ or tools/);
  private  a module includes another module's private header (a path inside
           its folder rather than include/tern/) — tests excepted, and
           base/'s headers, which are the internal floor every module may
           use (little-endian coding, wire codes, XXH3, thread tracking;
           not public API, so not in include/tern/);
  unknown  a public header has no module below (HEADER_MODULE), so the rule
           cannot place it: add it.

Known exceptions are listed in EXCEPTIONS with the reason, the one place to
look; remove an entry when its reason is gone. Run by CMake at configure
time and before every build (the build fails), and by ctest (layout_check).

Usage: check_layout.py [-q] [REPO_ROOT]  (default: this script's repository;
-q: print nothing when the rule holds)
"""
import fnmatch
import os
import re
import sys

# Layers, lowest first. A file may include its own layer and those below.
LAYERS = [
    ("base", ["base"]),
    ("transport", ["transport"]),
    ("format", ["format"]),
    ("domain", ["xfer", "patch", "quant", "checkpoint", "topology", "gpu", "datagen"]),
    ("agent", ["agent"]),
    ("front", ["tools", "capi", "python"]),
    ("harness", ["tests", "bench"]),  # may include anything
]
LAYER_OF_MODULE = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}

# Modules whose headers every module above may include: base/ (the internal
# floor: little-endian coding, wire codes, XXH3, thread tracking) and format/
# (the host-device formats patch/, quant/ and gpu/ share). Neither is public
# API, so neither is in include/tern/.
FLOORS = ("base", "format")

BACKENDS = ["loopback", "tcp", "ucx", "verbs", "fault"]

# The module each public header belongs to (include/tern/<name>).
HEADER_MODULE = {
    # base/
    "export.h": "base", "status.h": "base", "dtype.h": "base", "view.h": "base",
    "thread_pool.h": "base", "log.h": "base", "clock.h": "base", "env.h": "base", "fault_env.h": "base",
    # transport/: the contract, the shared options and probes, the registry
    "transport.h": "transport", "connect.h": "transport", "transport_options.h": "transport",
    "transport_probe.h": "transport", "transport_registry.h": "transport",
    # transport/<backend>/ (see BACKEND_HEADERS)
    "loopback_transport.h": "transport", "tcp_transport.h": "transport",
    "ucx_transport.h": "transport", "verbs_transport.h": "transport",
    "fault_transport.h": "transport",
    # domain modules
    "xfer.h": "xfer", "xfer_chunks.h": "xfer",
    "patch.h": "patch", "digest.h": "patch", "apply_checkpoint.h": "patch",
    "quantize.h": "quant", "quant_plan.h": "quant", "float_cast.h": "quant",
    "cast_checkpoint.h": "quant",
    "checkpoint.h": "checkpoint",
    "topology.h": "topology",
    "datagen.h": "datagen",
    "gpu.h": "gpu",
    # agent/
    "version_manifest.h": "agent",
    "agent.h": "agent",
    "sidecar.h": "agent",
}
BACKEND_HEADERS = {f"tern/{b}_transport.h": b for b in BACKENDS}

# Files that may include any backend and other modules' private headers:
# tests and their support, the conformance suite, fuzzers, benchmarks.
TEST_SUPPORT = [
    "tests/*", "bench/*",
    "*_test.cc", "*/fuzz_*.cc", "*/test_util.h",
    "*_test_fixture.h",  # a gtest fixture shared by several *_test.cc
    "transport/conformance_test.cc",
    "transport/test_certs.h", "transport/test_certs.cc",  # throwaway PKI for TLS tests
    "transport/ucx/test_pair.h",
]

# (file pattern, included path pattern, reason). fnmatch patterns; '*'
# crosses folders.
EXCEPTIONS = [
    ("transport/conformance_test.cc", "tern/xfer*.h",
     "the conformance suite also runs xfer's chunk scheduler over every backend "
     "(transfers of many chunks, faults); it belongs in xfer/ or tests/ once split"),
    ("transport/conformance_test.cc", "xfer/*",
     "as above: xfer's wire helpers for the scheduler cases"),
]

SOURCE_DIRS = sorted(set(LAYER_OF_MODULE) | {"include"})
EXTENSIONS = (".h", ".hpp", ".cc", ".cpp", ".c", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def matches(path, patterns):
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def module_of_file(path):
    """(module, backend or None) of a repository path."""
    parts = path.split("/")
    if parts[0] == "include" and len(parts) >= 3 and parts[1] == "tern":
        name = "/".join(parts[2:])
        return HEADER_MODULE.get(name), BACKEND_HEADERS.get("tern/" + name)
    backend = parts[1] if parts[0] == "transport" and len(parts) > 2 and parts[1] in BACKENDS else None
    return parts[0], backend


def module_of_include(inc):
    """(module, backend, private) of an include path; module None if unknown."""
    parts = inc.split("/")
    if parts[0] == "tern":
        name = "/".join(parts[1:])
        return HEADER_MODULE.get(name), BACKEND_HEADERS.get(inc), False
    if parts[0] in LAYER_OF_MODULE:
        backend = parts[1] if parts[0] == "transport" and len(parts) > 2 and parts[1] in BACKENDS else None
        return parts[0], backend, True
    return None, None, False


def exception_for(path, inc):
    for file_pat, inc_pat, reason in EXCEPTIONS:
        if fnmatch.fnmatchcase(path, file_pat) and fnmatch.fnmatchcase(inc, inc_pat):
            return reason
    return None


def check_file(path, text):
    problems = []
    module, own_backend = module_of_file(path)
    if module is None:
        return [f"{path}: unknown: public header has no module; add it to HEADER_MODULE in "
                f"scripts/check_layout.py"]
    support = matches(path, TEST_SUPPORT)
    in_registry = path.startswith("transport/registry/")
    for inc in INCLUDE.findall(text):
        if "/" not in inc:
            continue  # a neighbour in the same folder
        inc_module, inc_backend, private = module_of_include(inc)
        if inc_module is None:
            if inc.startswith("tern/"):
                problems.append(f"{path}: unknown: {inc} has no module; add it to HEADER_MODULE in "
                                f"scripts/check_layout.py")
            continue
        if exception_for(path, inc):
            continue
        where = f"{path}: includes {inc}"
        if inc_backend and own_backend and inc_backend != own_backend:
            problems.append(f"{where}: sibling: backend '{own_backend}' includes backend "
                            f"'{inc_backend}' (shared helpers belong in transport/net/)")
            continue
        if inc_backend and inc_backend != own_backend and not in_registry and not support:
            problems.append(f"{where}: backend: only transport/registry/ and transport/{inc_backend}/ "
                            f"may include a backend header (use tern/transport_registry.h)")
            continue
        if support and inc.startswith("tests/support/"):
            continue  # shared test helpers (OwnedView, TempDir) serve tests in every module
        if LAYER_OF_MODULE[inc_module] > LAYER_OF_MODULE[module]:
            problems.append(f"{where}: layer: {module} ({LAYERS[LAYER_OF_MODULE[module]][0]}) must not "
                            f"depend on {inc_module} ({LAYERS[LAYER_OF_MODULE[inc_module]][0]})")
            continue
        if private and inc_module != module and inc_module not in FLOORS and not support:
            problems.append(f"{where}: private: {inc_module}'s private header; use its public header "
                            f"in include/tern/")
    return problems


def source_files(root):
    for top in SOURCE_DIRS:
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "build")
            for name in sorted(filenames):
                if name.endswith(EXTENSIONS):
                    full = os.path.join(dirpath, name)
                    yield os.path.relpath(full, root).replace(os.sep, "/"), full


def main(argv):
    args = argv[1:]
    quiet = "-q" in args
    args = [a for a in args if a != "-q"]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    problems, files = [], 0
    for rel, full in source_files(root):
        files += 1
        with open(full, encoding="utf-8", errors="replace") as f:
            problems += check_file(rel, f.read())
    for p in problems:
        print(p)
    if problems:
        print(f"check_layout: {len(problems)} violation(s) of the dependency rule in {files} files "
              f"(docs/architecture.md; exceptions: EXCEPTIONS in scripts/check_layout.py)")
        return 1
    if not quiet:
        print(f"check_layout: {files} files follow the dependency rule "
              f"({len(EXCEPTIONS)} listed exceptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
