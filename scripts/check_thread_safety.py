#!/usr/bin/env python3
"""Clang's thread-safety analysis over the sources whose shared state carries
annotations (base/thread_annotations.h): a syntax-only pass (no code made)
with -Wthread-safety as errors, each file with the flags its build compiled
it with (BUILD/compile_commands.json, any build of this tree: gcc's flags
suit clang here).

  scripts/check_thread_safety.py BUILD [-j N]

Exit 0 when every file is clean; otherwise clang's diagnostics and 1.
Annotated rooms are listed in ROOMS (their tests, fuzzers and benchmarks
left out); a file there that the build did not compile is not checked.
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import time

# The folders whose locks are annotated (docs/agent.md "Threads and locks").
# base/mutex.h is checked through them; ViewStore has no lock (one caller
# at a time: its owner's rule, in agent/daemon/agent_impl.h).
ROOMS = [
    "agent/board",
    "agent/daemon",
    "agent/engine",
    "agent/etcd",
    "agent/keyset",
    "agent/manifest",
    "agent/relay",
    "agent/sidecar",
    "transport/loopback",
    "transport/fault",
    "transport/tcp",
    "transport/ucx",
    "transport/verbs",
]
FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Wthread-safety-beta", "-Werror=thread-safety",
         "-Wno-unknown-warning-option"]
# gcc-only flags in the build's commands that clang does not take.
DROP = {"-fno-fat-lto-objects"}


def clang_command(entry, root):
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = ["clang++"]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):
            skip = a == "-o"
            continue
        if a in DROP or a.startswith("-fsanitize") or a.startswith("--param"):
            continue
        out.append(a)
    return out + FLAGS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(a.build, "compile_commands.json")) as f:
        entries = json.load(f)
    rooms = [os.path.join(root, r) + os.sep for r in ROOMS]
    jobs = {}
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if not path.endswith(".cc") or not any(path.startswith(r) for r in rooms):
            continue
        # Tests, fuzzers and benchmarks hold no annotated state of their own.
        name = os.path.basename(path)
        if name.endswith(("_test.cc", "_bench.cc")) or name.startswith("fuzz_"):
            continue
        jobs.setdefault(path, (clang_command(e, root), e["directory"]))
    if not jobs:
        print("check_thread_safety: no annotated sources in " + a.build, file=sys.stderr)
        return 1
    t0 = time.monotonic()

    def run(item):
        path, (cmd, cwd) = item
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        return path, r.returncode, r.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.j) as pool:
        for path, rc, err in pool.map(run, sorted(jobs.items())):
            if rc != 0:
                failed += 1
                sys.stderr.write(err)
    print("check_thread_safety: %d files, %d with errors (%.0f s)" %
          (len(jobs), failed, time.monotonic() - t0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
