#!/usr/bin/env python3
"""The transfer agent on the emulated WAN; run by bench/agent_wan/run.sh
inside the root's host namespace (so the root's admin port is 127.0.0.1).

Starts `tern-agent --root` in the first host of the first region and a member
in every other host (each with `ip netns exec`), publishes a datagen trace
version by version with `tern publish`, and per version records:
  * publish: how long `tern publish` took (it returns once the root has
    diffed, written and fsynced the objects and sent HEAD);
  * first/last (status): when the root's /status (the JSON `tern status
    --json` prints, fetched over HTTP every --poll-ms so that no process is
    spawned per poll) first showed one member / every member serving it;
    a member heartbeats the moment it serves, so this includes one member to
    root one-way latency and up to one poll period;
  * first/last (disk): the commit time of each member's view store (the
    mtime of DIR/views/state.json, read once every member serves the
    version and before the next is published): the moment it served;
  * the root's own first_served_s/last_served_s from /status "versions";
  * the physical bound: shipped bytes over the narrowest configured rate,
    plus the one-way delay from the root's region to the farthest host.
  * the last member's breakdown: when it held the whole object, how long the
    object waited for the agent's work thread, the view store's phases
    (apply, sync, state + kept patch + switch), from its log lines;
  * the CPU floor: the CPU every agent used between publish and the last
    member serving (from /proc), and the members' CPU while applying, each
    over the machine's cores: the time the version would take if CPU were
    the only limit; and how busy the whole machine was meanwhile (other
    work included).
Then compares every member's DIR/current tensor by tensor, bit for bit, with
the published checkpoint. Exit status 1 on a mismatch or a version not served
by every member within --deadline-s.
"""
import argparse
import glob
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.request

# The tests' throwaway PKI (tests/cli/pki.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "cli"))
from pki import node_pki  # noqa: E402


def parse_wan_config(path):
    regions, links = [], {}
    for line in open(path):
        w = line.split("#", 1)[0].split()
        if not w:
            continue
        if w[0] == "region":
            regions.append(w[1])
        elif w[0] == "link":
            kv = dict(x.split("=", 1) for x in w[3:])
            spec = (float(kv.get("delay_ms", 0)), float(kv.get("rate_mbit", 0)))
            links[(w[1], w[2])] = spec
            links[(w[2], w[1])] = spec
    return regions, links


def tensors(path):
    """name -> (dtype, shape, bytes) of every tensor of a checkpoint dir."""
    out = {}
    for n in sorted(os.listdir(path)):
        if not n.endswith(".safetensors"):
            continue
        with open(os.path.join(path, n), "rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(size))
            data = f.read()
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            out[name] = (t["dtype"], tuple(t["shape"]), data[a:b])
    return out


class Agent:
    def __init__(self, work, ns, name, argv):
        self.name = name
        self.dir = os.path.join(work, "agents", name)
        self.log_path = os.path.join(work, "agents", name + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns] + argv + ["--data", self.dir, "--id", name],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)

    def wait_started(self):
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            raise SystemExit("tern-agent %s did not start: %r (log %s)" % (self.name, line, self.log_path))
        m = re.search(r"admin http://(\S+)", line)
        self.admin = m.group(1) if m else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def proc_cpu_s(pid):
    """user + system CPU seconds of a process (0 once it is gone)."""
    try:
        stat = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_s():
    """(busy, total) CPU seconds of the whole machine, all cores."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    total = sum(f[:8])  # user nice system idle iowait irq softirq steal
    return (total - f[3] - f[4]) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", required=True, help="the testbed's hosts file (NAME NS ADDRESS lines)")
    ap.add_argument("--config", required=True)
    ap.add_argument("--tern", required=True)
    ap.add_argument("--agent", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--params", default="20M")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", default="1e-6")
    ap.add_argument("--poll-ms", type=float, default=20)
    ap.add_argument("--deadline-s", type=float, default=120, help="per version: publish to every member")
    ap.add_argument("--no-tls", action="store_true")
    ap.add_argument("--agent-args", default="", help="extra flags for every tern-agent")
    ap.add_argument("--gap-s", type=float, default=4,
                    help="pause after a version is verified before the next publish (a trainer step; "
                         "members prepare their spare view in it, after --spare-grace-ms)")
    a = ap.parse_args()

    regions, links = parse_wan_config(a.config)
    hosts = [l.split() for l in open(a.hosts) if l.strip()]  # name ns address
    root_name, root_ns, root_addr = hosts[0]
    root_region = root_name.rsplit("-", 1)[0]
    os.makedirs(os.path.join(a.work, "agents"), exist_ok=True)

    t0 = time.time()
    trace = os.path.join(a.work, "trace")
    subprocess.run([a.tern, "datagen", "--out", trace, "--params", a.params, "--steps", str(a.steps),
                    "--lr", a.lr, "--threads", "1"], check=True, capture_output=True)
    print("datagen: %s parameters, %d steps in %.1f s" % (a.params, a.steps, time.time() - t0), flush=True)

    sec = ["--no-tls"] if a.no_tls else node_pki(a.work, [h[2] for h in hosts])
    common = [a.agent, "--heartbeat-ms", "200"] + sec + a.agent_args.split()
    agents = []
    try:
        root = Agent(a.work, root_ns, "root", common + ["--root", "--listen", root_addr + ":7400", "--admin",
                                                         "127.0.0.1:0", "--region", root_region])
        agents.append(root)
        root.wait_started()
        key = os.path.join(root.dir, "public-key.pem")
        members = []
        for name, ns, addr in hosts[1:]:
            m = Agent(a.work, ns, name, common + ["--join", root_addr + ":7400", "--listen", addr + ":7400",
                                                  "--region", name.rsplit("-", 1)[0], "--trust-key", key])
            agents.append(m)
            members.append(m)
        for m in members:
            m.wait_started()

        def status():
            with urllib.request.urlopen("http://%s/status" % root.admin, timeout=5) as r:
                return json.loads(r.read())

        deadline = time.time() + 60
        while len(status()["members"]) < len(members):
            if time.time() > deadline:
                raise SystemExit("only %d of %d members joined in 60 s" % (len(status()["members"]), len(members)))
            time.sleep(0.1)
        s = status()
        print("%d members joined in %.1f s; tree: %s" % (len(members), time.time() - t0, ", ".join(
            "%s<-%s" % (m["id"], m["parent"] or "?") for m in sorted(s["members"], key=lambda m: m["id"]))),
            flush=True)

        rates = [r for (_, r) in links.values() if r > 0]
        narrowest_mbit = min(rates) if rates else 0
        far_s = max(links.get((root_region, h[0].rsplit("-", 1)[0]), (0, 0))[0] for h in hosts[1:]) / 1e3
        rows, failed = [], False
        for v in range(1, a.steps + 1):
            ckpt = os.path.join(trace, "step-%06d" % (v - 1))
            cpu0 = {x.name: proc_cpu_s(x.proc.pid) for x in agents}
            mach0 = machine_cpu_s()
            t_start = time.time()
            r = subprocess.run([a.tern, "publish", "--board", root.admin, ckpt, "--version", str(v)],
                               capture_output=True, text=True, timeout=300)
            t_pub = time.time()
            if r.returncode != 0:
                raise SystemExit("tern publish version %d failed: %s" % (v, r.stderr.strip()))
            first = last = None
            deadline = t_pub + a.deadline_s
            while time.time() < deadline:
                now = time.time()
                served = [m["version"] for m in status()["members"]]
                if first is None and any(x >= v for x in served):
                    first = now - t_pub
                if len(served) == len(members) and all(x >= v for x in served):
                    last = now - t_pub
                    break
                time.sleep(a.poll_ms / 1e3)
            t_end = time.time()
            cpu_window = {x.name: proc_cpu_s(x.proc.pid) - cpu0[x.name] for x in agents}
            mach1 = machine_cpu_s()
            if last is None:
                failed = True
                print("FAIL: version %d not served by every member within %g s: %s" % (
                    v, a.deadline_s, {m["id"]: m["version"] for m in status()["members"]}), flush=True)
                break
            # The commit record's mtime is when each member switched.
            commits, commit_at = [], {}
            for m in members:
                st = os.path.join(m.dir, "views", "state.json")
                if json.load(open(st))["version"] == v:
                    commits.append(os.stat(st).st_mtime - t_pub)
                    commit_at[m.name] = commits[-1]
            # The root's own figures arrive with the last heartbeat.
            rv = None
            for _ in range(100):
                rv = next(x for x in status()["versions"] if x["version"] == v)
                if rv["last_served_s"] >= 0:
                    break
                time.sleep(0.02)
            want = tensors(ckpt)
            bad = [m.name for m in members if tensors(os.path.join(m.dir, "current")) != want]
            if bad:
                failed = True
                print("FAIL: version %d differs from the published checkpoint at %s" % (v, ", ".join(bad)))
            shipped = rv["patch_bytes"] or rv["keyframe_bytes"]
            bound = (shipped * 8 / (narrowest_mbit * 1e6) if narrowest_mbit else 0) + far_s
            rows.append(dict(version=v, t_publish_returned=t_pub, shipped=shipped, keyframe=rv["patch_bytes"] == 0, view=rv["view_bytes"],
                             publish=t_pub - t_start, first=first, last=last,
                             disk_first=min(commits) if len(commits) == len(members) else None,
                             disk_last=max(commits) if len(commits) == len(members) else None,
                             commit_at=commit_at, root_first=rv["first_served_s"], root_last=rv["last_served_s"], bound=bound,
                             window=t_end - t_start, agents_cpu=sum(cpu_window.values()),
                             machine_busy=mach1[0] - mach0[0], machine_total=mach1[1] - mach0[1],
                             verified=len(members) - len(bad)))
            print("version %d served by all %d members %.3f s after publish returned; %d/%d bitwise" % (
                v, len(members), last, len(members) - len(bad), len(members)), flush=True)
            if v < a.steps:
                time.sleep(a.gap_s)

        # Where a member's time goes: "applied in" (the agent, from the
        # object complete to serving) and the view store's phases.
        applied, by_member, phases, waited, apply_cpu, store_of = {}, {}, {}, {}, {}, {}
        for m in members:
            for line in open(m.log_path):
                mm = re.search(r"serving version (\d+) .*applied in ([0-9.]+) s", line)
                if mm:
                    applied.setdefault(int(mm.group(1)), []).append(float(mm.group(2)))
                    by_member[(m.name, int(mm.group(1)))] = float(mm.group(2))
                    # Since the object was complete, and the process's CPU
                    # while it applied (agents that log both).
                    mw = re.search(r"waited ([0-9.]+) s for the work thread, process cpu ([0-9.]+) s", line)
                    if mw:
                        waited[(m.name, int(mm.group(1)))] = float(mw.group(1))
                        apply_cpu.setdefault(int(mm.group(1)), []).append(float(mw.group(2)))
                mm = re.search(r"view_store: serving version (\d+) .*: (\d+) ms = catch-up (\d+) \+ apply (\d+) "
                               r"\+ sync (\d+) \+ state, kept patch, switch (\d+) ms", line)
                if mm:
                    phases.setdefault(int(mm.group(1)), []).append([int(x) for x in mm.groups()[1:]])
                    store_of[(m.name, int(mm.group(1)))] = [int(x) for x in mm.groups()[1:]]
        for r in rows:
            # When the object was complete at each member: its commit minus its apply time.
            got = [t - by_member[(n, r["version"])] for n, t in r["commit_at"].items()
                   if (n, r["version"]) in by_member]
            r["received_last"] = max(got) if len(got) == len(members) else None

        print()
        print("members %d (+ root in %s), regions %s, narrowest rate %g Mbit/s, one-way to the farthest "
              "region %.0f ms, %s" % (len(members), root_name, "/".join(regions), narrowest_mbit, far_s * 1e3,
                                       "plain TCP (--no-tls)" if a.no_tls else "mutual TLS"))
        print("times in seconds after `tern publish` returned; bound = shipped bytes / narrowest rate + "
              "one-way latency to the farthest region")
        hdr = ("version", "shipped", "publish", "first", "last", "disk 1st", "disk last", "root 1st", "root last",
               "bound", "last/bound", "recv last", "apply med", "apply max", "verified")
        print("%7s %11s %8s %7s %7s %8s %9s %8s %9s %7s %10s %9s %9s %9s %9s" % hdr)
        fmt = lambda x: "%.3f" % x if x is not None else "-"
        for r in rows:
            ap_ = sorted(applied.get(r["version"], [0]))
            print("%7d %11s %8.3f %7s %7s %8s %9s %8s %9s %7.3f %10s %9s %9.3f %9.3f %6d/%d" % (
                r["version"], "%.2f MB%s" % (r["shipped"] / 1e6, "*" if r["keyframe"] else ""), r["publish"],
                fmt(r["first"]), fmt(r["last"]), fmt(r["disk_first"]), fmt(r["disk_last"]), fmt(r["root_first"]),
                fmt(r["root_last"]), r["bound"], "%.1fx" % (r["disk_last"] / r["bound"]) if r["disk_last"]
                else "-", fmt(r["received_last"]), ap_[len(ap_) // 2], ap_[-1], r["verified"], len(members)))
        print("(* keyframe; recv last: the latest time a member held the whole object, its commit minus its "
              "'applied in')")
        # The member that served last, step by step: what is on its critical
        # path after the object is complete.
        cores = os.cpu_count() or 1
        print("last member, seconds after publish returned: held the object (+ waited for the work thread) "
              "-> view store total = catch-up + apply + sync + state/kept/switch (+ agent rest) -> served")
        for r in rows:
            v = r["version"]
            if not r["commit_at"]:
                continue
            name, t_serve = max(r["commit_at"].items(), key=lambda kv: kv[1])
            ain = by_member.get((name, v))
            w = waited.get((name, v))
            ph = store_of.get((name, v))
            if ain is None:
                continue
            start = t_serve - ain
            held = start - w if w is not None else None
            parts = ("%d = %d + %d + %d + %d ms" % tuple(ph)) if ph else "-"
            rest = ain * 1e3 - ph[0] if ph else 0
            print("  %d: %-5s held %s (+ waited %s) -> apply began %.3f -> %s (+ %d ms) -> served %.3f" % (
                v, name, fmt(held), "%.3f" % w if w is not None else "-", start, parts, rest, t_serve))
        print("CPU floor per version (%d cores): all agents' CPU from publish to the last member serving / cores; "
              "members' CPU while applying (sum) / cores; machine busy = every process's CPU in that window "
              "(other engineers' work included) / (window x cores)" % cores)
        for r in rows:
            v = r["version"]
            ac = apply_cpu.get(v, [])
            busy = r["machine_busy"] / r["machine_total"] if r["machine_total"] else 0
            print("  %d: window %.3f s: agents %.2f cpu s -> floor %.3f s; apply %.2f cpu s over %d members -> "
                  "floor %.3f s; machine busy %.0f%%, agents %.0f%% of it" % (
                      v, r["window"], r["agents_cpu"], r["agents_cpu"] / cores, sum(ac), len(ac),
                      sum(ac) / cores, busy * 100,
                      100 * r["agents_cpu"] / r["machine_busy"] if r["machine_busy"] else 0))
        print("view store phases, median over members, ms: version: total = catch-up + apply + sync + switch")
        prepared = {}
        for m in members:
            for line in open(m.log_path):
                mm = re.search(r"view_store: spare views/\S+ at version (\d+) \((in place|copied)[^)]*\) in (\d+) ms", line)
                if mm:
                    prepared.setdefault(int(mm.group(1)), []).append(int(mm.group(3)))
        for v in sorted(phases):
            med = [sorted(col)[len(col) // 2] for col in zip(*phases[v])]
            print("  %d: %d = %d + %d + %d + %d (%d members)" % (v, *med, len(phases[v])))
        for v in sorted(prepared):
            print("  spare brought to %d between versions: median %d ms, max %d ms (%d members)" % (
                v, sorted(prepared[v])[len(prepared[v]) // 2], max(prepared[v]), len(prepared[v])))
        # CPU and memory of each agent (its process: `ip netns exec` execs
        # the agent), and the bytes each member received and forwarded.
        usage = {}
        bytes_by_id = {m["id"]: m for m in status()["members"]}
        tick = os.sysconf("SC_CLK_TCK")
        for x in agents:
            try:
                stat = open("/proc/%d/stat" % x.proc.pid).read().rsplit(")", 1)[1].split()
                mem = dict(l.split(":", 1) for l in open("/proc/%d/status" % x.proc.pid))
            except OSError:
                continue
            kb = lambda k: int(mem.get(k, "0 kB").split()[0])
            b = bytes_by_id.get(x.name, {})
            usage[x.name] = dict(cpu_s=(int(stat[11]) + int(stat[12])) / tick, rss_kb=kb("VmRSS"),
                                 hwm_kb=kb("VmHWM"), anon_kb=kb("RssAnon"), file_kb=kb("RssFile"),
                                 bytes_in=b.get("bytes_in", 0), bytes_out=b.get("bytes_out", 0))
        print("agents: cpu s (user+sys over the run), resident MB (peak; anonymous + file-backed now), "
              "received/forwarded MB")
        for name in sorted(usage, key=lambda n: (n != "root", n)):
            u = usage[name]
            print("  %-6s cpu %6.2f s  rss %6.1f MB (peak %6.1f; anon %6.1f + file %6.1f)  in %8.1f MB  out %8.1f MB" % (
                name, u["cpu_s"], u["rss_kb"] / 1e3, u["hwm_kb"] / 1e3, u["anon_kb"] / 1e3, u["file_kb"] / 1e3,
                u["bytes_in"] / 1e6, u["bytes_out"] / 1e6))
        relays = [u for n, u in usage.items() if n != "root" and u["bytes_out"] > 0]
        leaves = [u for n, u in usage.items() if n != "root" and u["bytes_out"] == 0]
        if relays and leaves:
            # Every member applies the same versions; what a relay spends
            # beyond a leaf is what forwarding costs.
            mean = lambda xs: sum(xs) / len(xs)
            extra = mean([u["cpu_s"] for u in relays]) - mean([u["cpu_s"] for u in leaves])
            out_gb = mean([u["bytes_out"] for u in relays]) / 1e9
            print("forwarding: relays %d (mean cpu %.2f s, forwarded %.1f MB), leaves %d (mean cpu %.2f s): "
                  "%.2f cpu s per forwarded GB (relay minus leaf); anonymous memory max %.1f MB relay, %.1f MB leaf" % (
                      len(relays), mean([u["cpu_s"] for u in relays]), out_gb * 1e3, len(leaves),
                      mean([u["cpu_s"] for u in leaves]), extra / out_gb if out_gb else 0,
                      max(u["anon_kb"] for u in relays) / 1e3, max(u["anon_kb"] for u in leaves) / 1e3))
        print(json.dumps({"rows": rows, "usage": usage}), file=open(os.path.join(a.work, "result.json"), "w"))
        return 1 if failed or len(rows) < a.steps else 0
    finally:
        for x in reversed(agents):
            x.stop()


if __name__ == "__main__":
    sys.exit(main())
