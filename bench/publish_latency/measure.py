#!/usr/bin/env python3
"""Publish latency on the root (docs/benchmarks.md, "Publish latency").

For each view size: a datagen trace (BF16, ~1.5% of values changed per
version at --lr 3e-7), a root and one member on loopback (plain TCP), and
V publishes through `tern publish`. Per version it reads the root's stage
spans (/status versions[].publish), the call -> return time of `tern
publish` (call) and the call -> member serving time (member, polled), and
runs `tern diff` of the same two versions alone (the time it reports:
D(base) and diff + encode). Prints per-stage medians over the patch
versions (version 1, the first keyframe, is left out) and the ratio
offered_s / diff alone, the goal being <= 2.

Several agent builds (--agent LABEL=PATH, repeated) run in the same
invocation, alternating per round (A B, B A, ...) so that load changes hit
them alike; each round starts every agent afresh.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

STAGES = ["prepare_s", "verify_prev_s", "diff_s", "keyframe_s", "hash_s", "sign_s", "write_s",
          "record_s", "announce_s", "offered_s", "apply_s", "retain_s", "total_s"]


def wait_for(cond, timeout_s, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise SystemExit("timed out waiting for " + what)


class Agent:
    def __init__(self, agent_bin, tmp, name, args):
        self.dir = os.path.join(tmp, name)
        self.log_path = os.path.join(tmp, name + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([agent_bin, "--listen", "127.0.0.1:0", "--data", self.dir, "--id", name,
                                      "--heartbeat-ms", "200", "--no-tls"] + args,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (\S+?)(,|$)", line)
        if not m:
            self.proc.kill()
            raise SystemExit("%s did not start: %r (see %s)" % (name, line, self.log_path))
        self.address = m.group(1)
        m = re.search(r"admin http://(\S+)", line)
        self.admin = m.group(1) if m else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.log.close()


def status(tern, admin):
    r = subprocess.run([tern, "status", "--board", admin, "--json"], capture_output=True, text=True,
                       timeout=60, check=True)
    return json.loads(r.stdout)


def run_agent(tern, agent_bin, steps, tmp, keyframe_every):
    """One root + one member; publishes every step; returns per-version
    {stage: seconds} plus the client's call -> return time."""
    with open(os.path.join(tmp, "join.token"), "w") as f:
        f.write("bench-join\n")
    tok = ["--join-token-file", os.path.join(tmp, "join.token")]
    agents = []
    out = {}
    try:
        root = Agent(agent_bin, tmp, "root", ["--root", "--admin", "127.0.0.1:0",
                                              "--keyframe-every", str(keyframe_every)] + tok)
        agents.append(root)
        member = Agent(agent_bin, tmp, "member",
                       ["--join", root.address, "--trust-key", os.path.join(root.dir, "public-key.pem")] + tok)
        agents.append(member)
        wait_for(lambda: len(status(tern, root.admin)["members"]) == 1, 60, "the member joined")
        for v, step in enumerate(steps, start=1):
            t = time.time()
            r = subprocess.run([tern, "publish", "--board", root.admin, step, "--version", str(v)],
                               capture_output=True, text=True, timeout=900)
            call_s = time.time() - t
            if r.returncode != 0:
                raise SystemExit("publish %d: %s (see %s)" % (v, r.stderr.strip(), root.log_path))
            wait_for(lambda: all(m["version"] == v for m in status(tern, root.admin)["members"]), 600,
                     "the member at version %d" % v)
            member_s = time.time() - t  # polled: within ~0.1 s late
            spans = next(x["publish"] for x in status(tern, root.admin)["versions"] if x["version"] == v)
            spans["call_s"] = call_s
            spans["member_s"] = member_s
            out[v] = spans
    finally:
        for a in reversed(agents):
            a.stop()
    return out


def diff_alone(tern, steps, tmp):
    """`tern diff` of each consecutive pair, by target version: the seconds
    it reports itself (tern::Diff alone: D(base), which every patch names,
    and diff + encode; not the opening or the write), and its wall time."""
    out = {}
    for v in range(2, len(steps) + 1):
        patch = os.path.join(tmp, "alone.patch")
        t = time.time()
        r = subprocess.run([tern, "diff", steps[v - 2], steps[v - 1], "-o", patch, "--force",
                            "--base-version", str(v - 1), "--target-version", str(v)],
                           check=True, capture_output=True, text=True)
        wall_s = time.time() - t
        m = re.search(r"(\d+(\.\d+)?) s$", r.stderr.splitlines()[0] if r.stderr else "")
        if not m:
            raise SystemExit("tern diff: no time in its report: %r" % r.stderr[:200])
        out[v] = {"reported_s": float(m.group(1)), "wall_s": wall_s}
        os.remove(patch)
    return out


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tern", required=True)
    ap.add_argument("--agent", action="append", required=True, metavar="LABEL=PATH",
                    help="a tern-agent build; repeat to compare builds in one run")
    ap.add_argument("--params", default="20M", help="comma-separated model sizes (20M: a 40 MB BF16 view)")
    ap.add_argument("--versions", type=int, default=6, help="versions published per round (1 keyframe + patches)")
    ap.add_argument("--lr", default="3e-7")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keyframe-every", type=int, default=1000,
                    help="root --keyframe-every (large: patches only, the case in question)")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "tern-publat-traces"),
                    help="datagen traces are kept here between runs")
    ap.add_argument("--json", help="also write every measurement here")
    a = ap.parse_args()
    builds = []
    for spec in a.agent:
        label, _, path = spec.partition("=")
        if not path or not os.access(path, os.X_OK):
            raise SystemExit("--agent %r: expected LABEL=PATH to an executable tern-agent" % spec)
        builds.append((label, path))
    if a.versions < 2:
        raise SystemExit("--versions must be at least 2 (one keyframe, then patches)")
    results = {}
    for params in a.params.split(","):
        trace = os.path.join(a.cache, "%s-lr%s-v%d" % (params, a.lr, a.versions))
        if not os.path.isdir(trace):
            os.makedirs(a.cache, exist_ok=True)
            print("datagen %s (%d versions) into %s ..." % (params, a.versions, trace), file=sys.stderr)
            subprocess.run([a.tern, "datagen", "--out", trace + ".tmp", "--params", params, "--steps",
                            str(a.versions - 1), "--lr", a.lr, "--threads", "1", "--force"],
                           check=True, capture_output=True)
            os.rename(trace + ".tmp", trace)
        steps = sorted(os.path.join(trace, d) for d in os.listdir(trace) if d.startswith("step-"))
        view_bytes = sum(os.path.getsize(os.path.join(steps[0], f)) for f in os.listdir(steps[0])
                         if f.endswith(".safetensors"))
        per = {label: [] for label, _ in builds}
        alone = []
        for r in range(a.rounds):
            order = builds if r % 2 == 0 else list(reversed(builds))
            for label, path in order:
                tmp = tempfile.mkdtemp(prefix="tern-publat-")
                try:
                    per[label].append(run_agent(a.tern, path, steps, tmp, a.keyframe_every))
                    alone.append(diff_alone(a.tern, steps, tmp))
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        alone_s = median([x["reported_s"] for run in alone for x in run.values()])
        alone_wall_s = median([x["wall_s"] for run in alone for x in run.values()])
        print("\n## %s params, view %.0f MB, %d versions x %d rounds; `tern diff` alone: median %.3f s "
              "(%.3f s wall)" % (params, view_bytes / 1e6, a.versions, a.rounds, alone_s, alone_wall_s))
        cols = STAGES + ["call_s", "member_s"]
        print("| build | " + " | ".join(c[:-2] for c in cols) + " | offered / diff alone |")
        print("|---" * (len(cols) + 2) + "|")
        for label, _ in builds:
            patches = [run[v] for run in per[label] for v in run if v >= 2]
            med = {c: median([p[c] for p in patches]) for c in cols}
            print("| %s | " % label + " | ".join("%.3f" % med[c] for c in cols) +
                  " | %.2f |" % (med["offered_s"] / alone_s))
        results[params] = {"view_bytes": view_bytes, "diff_alone_s": alone, "runs": per}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
