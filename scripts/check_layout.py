#!/usr/bin/env python3
"""Checks tern's dependency rule (docs/architecture.md) on every #include and
on every link edge between tern libraries.

    tools/ capi/ python/  ->  agent/  ->  domain modules  ->  transport/, format/  ->  base/

The order is explicit: MODULES lists what each module may use, each edge with
its reason (a module may use those and what lies below them, nothing else);
ROOMS orders the rooms inside agent/, gpu/ and transport/, floor first.

Fails (exit 1, one line per violation) when
  backend  a backend (transport/<b>/, include/tern/<b>_transport.h) is
           included or linked from outside transport/registry/ and that
           backend's own folder (tests, the conformance suite, fuzzers and
           benchmarks excepted: TEST_SUPPORT below);
  sibling  a backend includes or links another backend, tests included:
           shared helpers move down to transport/net/ or transport/*.h;
  layer    a module uses a module that is not below it in MODULES (base must
           not include transport, checkpoint must not include patch, no
           domain module includes agent/ or tools/);
  room     a room uses a room listed after it in ROOMS (agent/board must not
           include agent/etcd; gpu/ops must not include gpu/host);
  private  a module includes another module's private header (a path inside
           its folder rather than include/tern/) — tests excepted, and
           base/'s and format/'s headers, the internal floors (FLOORS);
  test     a library links a test-support library (tern_test_certs);
  unknown  a public header has no module (HEADER_MODULE), a sub-folder of a
           module with rooms is not in ROOMS, or a library lies outside every
           module: the rule cannot place it, so add it.

Known exceptions are listed in EXCEPTIONS with the reason, the one place to
look; remove an entry when its reason is gone. The #include check runs at
configure time and before every build (the build fails), the link check at
the end of configure (cmake/TernLayout.cmake writes the link table), and both
as the ctest layout_check.

Usage: check_layout.py [-q] [--links TABLE] [REPO_ROOT]  (default: this
script's repository; -q: print nothing when the rule holds; --links: also
check the link table CMake wrote, build/tern_links.tsv)
"""
import fnmatch
import os
import re
import sys

# The modules and what each may use directly, lowest first, each edge with
# its reason. A module may use what it lists and, through those, everything
# below them (the transitive closure); nothing else: two modules that list
# neither each other are strangers (topology/ knows nothing of patch/). The
# graph must stay acyclic (checked at load). tests/ and bench/ (HARNESS) may
# use anything.
MODULES = {
    "base": {},
    "format": {"base": "tern_format links tern_base; its headers need only each other today"},
    "transport": {"base": "Status, Env, byte coding and XXH3 for frames"},
    "checkpoint": {"base": "files, maps and Status through the Env"},
    "topology": {"base": "pure planning functions returning Status; no sockets, no clock"},
    "patch": {"format": "value codes, digest terms and Huffman construction shared with gpu/",
              "checkpoint": "ApplyCheckpoint (tern/apply_checkpoint.h) applies patches to "
                            "checkpoint files (its own library, tern_apply_checkpoint)"},
    "quant": {"format": "minifloat bit layouts shared with gpu/",
              "checkpoint": "CastCheckpoint reads and writes whole checkpoints"},
    "datagen": {"quant": "traces are cast and quantized into served formats",
                "checkpoint": "traces are written as checkpoints"},
    "gpu": {"patch": "the kernels decode, apply and digest patches (the CPU codec is the oracle)",
            "quant": "the kernels cast and quantize as quant/ does (tern/gpu.h takes its formats)",
            "format": "the record codec and value codes compiled for the device"},
    "xfer": {"transport": "chunks and files move over any transport"},
    "agent": {"xfer": "the daemon serves and fetches objects with xfer's file service",
              "patch": "the root encodes versions, members verify and apply them",
              "checkpoint": "versions are read from and views kept as checkpoints",
              "topology": "the root plans the relay tree",
              "transport": "the relay's links (through xfer for the daemon)"},
    "tools": {"agent": "tern agent, tern publish, tern status, tern demo",
              "xfer": "tern xfer (and the registry below it: tern transports)",
              "datagen": "tern datagen", "quant": "tern cast",
              "patch": "tern diff, apply, inspect"},
    "capi": {"agent": "the C ABI embeds the agent"},
    "python": {"capi": "bindings over the C ABI", "agent": "bindings embed the agent"},
}
HARNESS = ("tests", "bench")  # may use any module, backends included

BACKENDS = ["loopback", "tcp", "ucx", "verbs", "fault"]

# Rooms inside a module, floor first: a room may use the rooms listed before
# it (and its own), never those after. "" is the module's own folder (and its
# public headers unless ROOM_OF_HEADER says otherwise). Test support
# (TEST_SUPPORT) may reach across, as across modules.
ROOMS = {
    # agent/CMakeLists.txt lists them in this order with what each holds.
    # https (TLS for cpp-httplib) is the floor of etcd's client and ops'
    # admin port;
    # control, board and relay name objects (manifest/object_ref.h);
    # freshness signs and checks HEAD beacons with manifest's keys, and
    # control carries them; keyset signs and checks key sets with manifest's
    # keys and moves its verifier from one key set to the next;
    # membership tracks members by control messages; etcd's board log
    # implements board/board_log.h; the sidecar polls a member over ops'
    # admin client; the engine adapter needs none of the others and sits
    # below the sidecar and the daemon, which drive it; daemon wires them
    # all; testing tests them.
    "agent": ["", "https", "manifest", "freshness", "keyset", "control", "membership", "board", "relay", "view_store", "etcd",
              "ops", "engine", "sidecar", "daemon", "testing"],
    # host-device ops (TERN_HD) < host code that plans over them < the kernels
    # that run both.
    "gpu": ["", "ops", "host", "kernels"],
    # the contract and the helpers backends share < socket helpers < backends
    # (leaves: never one another, see "sibling") < the registry that makes
    # them.
    "transport": ["", "net", *BACKENDS, "registry"],
}
ROOM_OF_HEADER = {
    "agent.h": "daemon", "version_manifest.h": "manifest", "key_set.h": "keyset",
    "transport_registry.h": "registry",
    **{f"{b}_transport.h": b for b in BACKENDS},
}


def _closure(modules):
    """Module -> every module it may use (itself included); raises on a cycle."""
    below = {}

    def visit(m, path):
        if m in path:
            raise ValueError("check_layout: MODULES has a cycle: " + " -> ".join(path + (m,)))
        if m not in below:
            seen = {m}
            for d in modules[m]:
                seen |= visit(d, path + (m,))
            below[m] = seen
        return below[m]

    for m in modules:
        visit(m, ())
    return below


MAY_USE = _closure(MODULES)
KNOWN_MODULES = set(MODULES) | set(HARNESS)


def may_use(module, used):
    return module in HARNESS or used in MAY_USE.get(module, ())


# Modules whose headers every module above may include: base/ (the internal
# floor: little-endian coding, wire codes, XXH3, thread tracking) and format/
# (the host-device formats patch/, quant/ and gpu/ share). Neither is public
# API, so neither is in include/tern/.
FLOORS = ("base", "format")

# The module each public header belongs to (include/tern/<name>).
HEADER_MODULE = {
    # base/
    "export.h": "base", "status.h": "base", "dtype.h": "base", "view.h": "base",
    "thread_pool.h": "base", "log.h": "base", "clock.h": "base", "env.h": "base", "fault_env.h": "base",
    # transport/: the contract, the shared options and probes, the registry
    "transport.h": "transport", "connect.h": "transport", "transport_options.h": "transport",
    "transport_probe.h": "transport", "transport_registry.h": "transport",
    # transport/<backend>/ (their rooms: ROOM_OF_HEADER)
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
    "key_set.h": "agent",
    "agent.h": "agent",
    "rank_publish.h": "agent",
    "sidecar.h": "agent",
    # capi/: the stable C ABI (libtern)
    "tern.h": "capi",
}

# Files that may include any backend and other modules' private headers:
# tests and their support, the conformance suite, fuzzers, benchmarks.
TEST_SUPPORT = [
    "tests/*", "bench/*",
    "*_test.cc", "*/fuzz_*.cc", "*/test_util.h",
    "*_test_fixture.h",  # a gtest fixture shared by several *_test.cc
    "*_bench.cc",  # benchmarks beside their module (quant_bench links patch/ to measure)
    "agent/testing/*",  # the agent's system tests, their fixtures, an etcd for tests
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

SOURCE_DIRS = sorted(KNOWN_MODULES | {"include"})
EXTENSIONS = (".h", ".hpp", ".cc", ".cpp", ".c", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def matches(path, patterns):
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def room_of_path(module, parts):
    """Room of a folder path split in parts (module first); None: a sub-folder
    of a module with rooms that ROOMS does not list."""
    if module not in ROOMS or len(parts) < 2:
        return ""
    return parts[1] if parts[1] in ROOMS[module] else None


def place_of_file(path):
    """(module, room) of a repository file path; module None: a public header
    HEADER_MODULE does not place."""
    parts = path.split("/")
    if parts[0] == "include" and len(parts) >= 3 and parts[1] == "tern":
        name = "/".join(parts[2:])
        return HEADER_MODULE.get(name), ROOM_OF_HEADER.get(name, "")
    return parts[0], room_of_path(parts[0], parts[:-1])


def place_of_include(inc):
    """(module, room, private) of an include path; module None if unknown."""
    parts = inc.split("/")
    if parts[0] == "tern":
        name = "/".join(parts[1:])
        return HEADER_MODULE.get(name), ROOM_OF_HEADER.get(name, ""), False
    if parts[0] in KNOWN_MODULES:
        return parts[0], room_of_path(parts[0], parts[:-1]), True
    return None, None, False


def backend_of(module, room):
    return room if module == "transport" and room in BACKENDS else None


def exception_for(path, inc):
    for file_pat, inc_pat, reason in EXCEPTIONS:
        if fnmatch.fnmatchcase(path, file_pat) and fnmatch.fnmatchcase(inc, inc_pat):
            return reason
    return None


def edge_problem(module, room, used_module, used_room, support):
    """(kind, message) when code placed at (module, room) may not use
    (used_module, used_room), or None. Shared by #includes and link edges."""
    own_backend, used_backend = backend_of(module, room), backend_of(used_module, used_room)
    if used_backend and own_backend and used_backend != own_backend:
        return "sibling", (f"backend '{own_backend}' uses backend '{used_backend}' "
                           f"(shared helpers belong in transport/net/)")
    if support:
        return None
    if used_backend and used_backend != own_backend and not (module == "transport" and room == "registry"):
        return "backend", (f"only transport/registry/ and transport/{used_backend}/ may use a backend "
                           f"(use tern/transport_registry.h)")
    if module != used_module and not may_use(module, used_module):
        return "layer", (f"{module} must not depend on {used_module} ({used_module} is not below "
                         f"{module}: MODULES in scripts/check_layout.py)")
    if module == used_module and module in ROOMS:
        order = ROOMS[module]
        if order.index(used_room) > order.index(room):
            return "room", (f"{module}/{room or '.'} must not depend on {module}/{used_room}, a room "
                            f"above it (ROOMS in scripts/check_layout.py, floor first: "
                            f"{', '.join(r for r in order if r)})")
    return None


def unknown_room(module, what):
    return (f"unknown: {what} is in a sub-folder of {module}/ that is not a room; add it to "
            f"ROOMS['{module}'] in scripts/check_layout.py")


def check_file(path, text):
    problems = []
    module, room = place_of_file(path)
    if module is None:
        return [f"{path}: unknown: public header has no module; add it to HEADER_MODULE in "
                f"scripts/check_layout.py"]
    if room is None:
        return [f"{path}: {unknown_room(module, path)}"]
    support = matches(path, TEST_SUPPORT)
    for inc in INCLUDE.findall(text):
        if "/" not in inc:
            continue  # a neighbour in the same folder
        inc_module, inc_room, private = place_of_include(inc)
        if inc_module is None:
            if inc.startswith("tern/"):
                problems.append(f"{path}: unknown: {inc} has no module; add it to HEADER_MODULE in "
                                f"scripts/check_layout.py")
            continue
        if exception_for(path, inc):
            continue
        where = f"{path}: includes {inc}"
        if inc_room is None:
            problems.append(f"{where}: {unknown_room(inc_module, inc)}")
            continue
        if support and inc.startswith("tests/support/"):
            continue  # shared test helpers (OwnedView, TempDir) serve tests in every module
        problem = edge_problem(module, room, inc_module, inc_room, support)
        if problem:
            problems.append(f"{where}: {problem[0]}: {problem[1]}")
            continue
        if private and inc_module != module and inc_module not in FLOORS and not support:
            problems.append(f"{where}: private: {inc_module}'s private header; use its public header "
                            f"in include/tern/")
    return problems


# Link edges. CMake writes one line per library of the build (tern_layout.cmake,
# at the end of configure): name, type, source folder and sources relative to
# the repository, and the targets it links, ';'-separated:
#   tern_patch<TAB>STATIC_LIBRARY<TAB>patch<TAB>patch/diff.cc;...<TAB>tern_format;tern_base;...
# Executables are leaves (nothing links them, so they make no cycle) and their
# #includes are checked above; libraries are checked here with the rules of
# #includes: the module order, the room order, backends linked only by the
# registry. A library whose sources are all TEST_SUPPORT (tern_test_certs,
# the etcd test server) or that lives in tests/, bench/ or the top folder may
# link anything and only test code may link it.
def read_link_table(text):
    libs = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 5:
            raise ValueError(f"check_layout: bad link table line: {line!r}")
        name, kind, folder, sources, links = fields
        libs[name] = (kind, folder, [s for s in sources.split(";") if s],
                      [l for l in links.split(";") if l])
    return libs


def check_links(libs):
    problems = []
    places = {}
    for name, (kind, folder, sources, links) in libs.items():
        parts = folder.split("/") if folder not in ("", ".") else [""]
        module = parts[0]
        support = module in HARNESS or module == "" or (
            bool(sources) and all(matches(s, TEST_SUPPORT) for s in sources))
        if not support and module not in MODULES:
            problems.append(f"{name} ({folder}/): unknown: a library outside every module; add "
                            f"its folder to MODULES in scripts/check_layout.py")
            continue
        room = room_of_path(module, parts) if not support else ""
        if room is None:
            problems.append(f"{name}: {unknown_room(module, folder + '/')}")
            continue
        places[name] = (module, room, support)
    for name, (kind, folder, sources, links) in sorted(libs.items()):
        if name not in places:
            continue
        module, room, support = places[name]
        for used in links:
            if used not in places or used == name:
                continue  # not a tern library (GTest::gtest, PkgConfig::ZSTD, -ldl)
            used_module, used_room, used_support = places[used]
            where = f"{name} ({folder}/) links {used} ({libs[used][1]}/)"
            if used_support and not support:
                problems.append(f"{where}: test: test support is for tests only")
                continue
            problem = edge_problem(module, room, used_module, used_room, support)
            if problem:
                problems.append(f"{where}: {problem[0]}: {problem[1]}")
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
    link_table = None
    if "--links" in args:
        i = args.index("--links")
        link_table = args[i + 1]
        del args[i:i + 2]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    problems, files = [], 0
    for rel, full in source_files(root):
        files += 1
        with open(full, encoding="utf-8", errors="replace") as f:
            problems += check_file(rel, f.read())
    libs = {}
    if link_table:
        with open(link_table, encoding="utf-8") as f:
            libs = read_link_table(f.read())
        problems += check_links(libs)
    for p in problems:
        print(p)
    what = f"{files} files" + (f" and {len(libs)} libraries' link edges" if link_table else "")
    if problems:
        print(f"check_layout: {len(problems)} violation(s) of the dependency rule in {what} "
              f"(docs/architecture.md; exceptions: EXCEPTIONS in scripts/check_layout.py)")
        return 1
    if not quiet:
        print(f"check_layout: {what} follow the dependency rule "
              f"({len(EXCEPTIONS)} listed exceptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
