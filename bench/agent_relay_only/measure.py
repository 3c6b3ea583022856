#!/usr/bin/env python3
"""Resident memory and CPU of a relay-only member (tern-agent --relay-only),
next to a serving relay in the same run. Processes on 127.0.0.1, mutual TLS.

Usage: measure.py TERN TERN_AGENT [--params 2M] [--versions 4] [--children 3]
                  [--gap-s 3] [--keep DIR] [--trace DIR]

Region eu is headed by a relay-only member (it joins first), region ap by a
serving member; each has --children serving members below it. A datagen
trace is published version by version (--gap-s apart). The relays'
/proc/PID/status is sampled every 50 ms: peak and steady (3 s after the
last version) RssAnon, RssFile, VmRSS, and VmHWM; CPU is utime + stime
from /proc/PID/stat, divided by the bytes each relay forwarded (its
bytes_out in the root's /status). obj_pk: the peak of the resident pages
of the relay's mappings under DIR/objects (its .part and object files),
summed from /proc/PID/smaps. Prints one table; exits non-zero if a
serving member does not serve the last version bit for bit.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# The tests' throwaway PKI and the WAN driver's checkpoint reader.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "tests", "cli"), os.path.join(HERE, "..", "agent_wan")]
from driver import tensors  # noqa: E402
from pki import node_pki  # noqa: E402


def wait_for(cond, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise SystemExit("timed out waiting for " + what)


class Agent:
    def __init__(self, agent_bin, tmp, name, args):
        self.name = name
        self.dir = os.path.join(tmp, name)
        self.log = open(os.path.join(tmp, name + ".log"), "w")
        tls = ["--tls-cert", os.path.join(tmp, "node.pem"), "--tls-key", os.path.join(tmp, "node.key"),
               "--tls-ca", os.path.join(tmp, "ca.pem")]
        self.proc = subprocess.Popen([agent_bin, "--listen", "127.0.0.1:0", "--data", self.dir, "--id", name,
                                      "--heartbeat-ms", "200"] + tls + args,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (\S+?)(,|$)", line)
        if not m:
            self.proc.kill()
            raise SystemExit("%s did not start: %r" % (name, line))
        self.address = m.group(1)
        m = re.search(r"admin http://(\S+)", line)
        self.admin = m.group(1) if m else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def proc_status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def objects_rss(pid):
    """Resident bytes of the mappings of files under a DIR/objects (the
    relay's object buffers, .part or complete), from /proc/PID/smaps."""
    total, inside = 0, False
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                inside = "/objects/" in line
            elif inside and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler(threading.Thread):
    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = {p: {} for p in pids}
        self.stop_flag = False

    def run(self):
        while not self.stop_flag:
            for p in self.pids:
                try:
                    s = proc_status(p)
                except OSError:
                    continue
                try:
                    s["objects"] = objects_rss(p)
                except OSError:
                    pass
                for k, v in s.items():
                    self.peak[p][k] = max(self.peak[p].get(k, 0), v)
            time.sleep(0.05)



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tern")
    ap.add_argument("agent")
    ap.add_argument("--params", default="2M")
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--children", type=int, default=3)
    ap.add_argument("--gap-s", type=float, default=3)
    ap.add_argument("--idle-s", type=float, default=5, help="idle CPU baseline before the first version")
    ap.add_argument("--keep", help="keep the run's files here")
    ap.add_argument("--trace", help="a datagen trace to reuse (made with the same --params and"
                    " --versions); generated into the run's directory when absent")
    ap.add_argument("--member-args", default="",
                    help="more tern-agent flags for every member, e.g. \"--window-bytes 16777216\"")
    a = ap.parse_args()

    tmp = a.keep or tempfile.mkdtemp(prefix="tern-relay-only-")
    os.makedirs(tmp, exist_ok=True)
    node_pki(tmp)
    trace = a.trace or os.path.join(tmp, "trace")
    if not os.path.isdir(trace):
        subprocess.run([a.tern, "datagen", "--out", trace, "--params", a.params, "--steps", str(a.versions),
                        "--lr", "1e-6", "--threads", "1"], check=True, capture_output=True)
    steps = sorted(os.path.join(trace, d) for d in os.listdir(trace) if d.startswith("step-"))
    with open(os.path.join(tmp, "join.token"), "w") as f:
        f.write("bench-join\n")
    tok = ["--join-token-file", os.path.join(tmp, "join.token")]
    agents = []
    try:
        root = Agent(a.agent, tmp, "root", ["--root", "--region", "us", "--admin", "127.0.0.1:0"] + tok)
        agents.append(root)

        def status():
            r = subprocess.run([a.tern, "status", "--board", root.admin, "--json"], capture_output=True,
                               text=True, timeout=30, check=True)
            return {m["id"]: m for m in json.loads(r.stdout)["members"]}

        common = (["--join", root.address, "--trust-key", os.path.join(root.dir, "public-key.pem")] + tok +
                  a.member_args.split())
        relay_only = Agent(a.agent, tmp, "eu-relay", common + ["--region", "eu", "--relay-only"])
        agents.append(relay_only)
        wait_for(lambda: len(status()) == 1, 30, "eu-relay joined")
        serving = Agent(a.agent, tmp, "ap-relay", common + ["--region", "ap"])
        agents.append(serving)
        wait_for(lambda: len(status()) == 2, 30, "ap-relay joined")
        leaves = []
        for region in ("eu", "ap"):
            for k in range(a.children):
                leaves.append(Agent(a.agent, tmp, "%s-%d" % (region, k), common + ["--region", region]))
                agents.append(leaves[-1])
                wait_for(lambda: len(status()) == 2 + len(leaves), 30, leaves[-1].name + " joined")
        tree = status()
        for l in leaves:
            want = l.name.split("-")[0] + "-relay"
            if tree[l.name]["parent"] != want:
                raise SystemExit("%s hangs under %s, not %s" % (l.name, tree[l.name]["parent"], want))

        relays = {"relay-only": relay_only, "serving": serving}
        idle = {k: proc_status(r.proc.pid) for k, r in relays.items()}
        # Heartbeats, probes and ticks cost CPU with no version moving: their
        # rate, measured here, is taken off the run's CPU.
        cpu_idle0 = {k: cpu_seconds(r.proc.pid) for k, r in relays.items()}
        time.sleep(a.idle_s)
        idle_rate = {k: (cpu_seconds(r.proc.pid) - cpu_idle0[k]) / a.idle_s for k, r in relays.items()}
        t0 = time.time()
        cpu0 = {k: cpu_seconds(r.proc.pid) for k, r in relays.items()}
        sampler = Sampler([r.proc.pid for r in relays.values()])
        sampler.start()
        version_s = []  # publish -> every member at the version
        for v, step in enumerate(steps, start=1):
            tv = time.time()
            r = subprocess.run([a.tern, "publish", "--board", root.admin, step, "--version", str(v)],
                               capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise SystemExit("publish %d: %s" % (v, r.stderr))
            wait_for(lambda: all(m["version"] == v for m in status().values()), 300, "version %d" % v)
            version_s.append(time.time() - tv)
            time.sleep(a.gap_s)
        time.sleep(3)
        steady = {k: proc_status(r.proc.pid) for k, r in relays.items()}
        elapsed = time.time() - t0
        cpu = {k: cpu_seconds(r.proc.pid) - cpu0[k] for k, r in relays.items()}
        net = {k: cpu[k] - idle_rate[k] * elapsed for k in relays}
        sampler.stop_flag = True
        sampler.join()
        final = status()
        bad = [l.name for l in leaves if tensors(os.path.join(l.dir, "current")) != tensors(steps[-1])]
        if bad:
            raise SystemExit("not bit for bit at the last version: %s" % bad)
        if os.path.lexists(os.path.join(relay_only.dir, "current")):
            raise SystemExit("the relay-only member has a DIR/current")
        view = sum(os.path.getsize(os.path.join(steps[-1], f)) for f in os.listdir(steps[-1]))
        print("model %s: view %.1f MB, %d versions, %d children per relay" %
              (a.params, view / 1e6, len(steps), a.children))
        mb = lambda x: "%.1f" % (x / 1e6)
        print("publish -> every member at the version (s): %s" % " ".join("%.1f" % t for t in version_s))
        print("run %.1f s; memory in MB (idle before the first version, peak, 3 s after the last);"
              " CPU net of the idle rate" % elapsed)
        print("%-10s %6s %6s | %7s %7s %7s %6s | %7s %7s | %6s %7s %7s | %6s %6s %6s | %s" %
              ("relay", "anon0", "file0", "anon_pk", "file_pk", "rss_pk", "obj_pk", "anon_end", "file_end",
               "hwm", "fwd MB", "in MB", "CPU s", "idle/s", "net s", "net CPU s per forwarded GB"))
        for k, r in relays.items():
            pk = sampler.peak[r.proc.pid]
            m = final[r.name]
            print("%-10s %6s %6s | %7s %7s %7s %6s | %8s %8s | %6s %7s %7s | %6.2f %6.3f %6.2f | %.2f" %
                  (k, mb(idle[k]["RssAnon"]), mb(idle[k]["RssFile"]), mb(pk["RssAnon"]), mb(pk["RssFile"]),
                   mb(pk["VmRSS"]), mb(pk.get("objects", 0)), mb(steady[k]["RssAnon"]), mb(steady[k]["RssFile"]),
                   mb(steady[k]["VmHWM"]), mb(m["bytes_out"]), mb(m["bytes_in"]), cpu[k], idle_rate[k],
                   net[k], net[k] / max(m["bytes_out"], 1) * 1e9))
        du = sum(os.path.getsize(os.path.join(relay_only.dir, "objects", f))
                 for f in os.listdir(os.path.join(relay_only.dir, "objects")))
        print("relay-only DIR/objects at the end: %s MB in %d files" %
              (mb(du), len(os.listdir(os.path.join(relay_only.dir, "objects")))))
    finally:
        for ag in reversed(agents):
            ag.stop()
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
