#!/usr/bin/env python3
"""One configuration of bench/fanout, run inside the root's namespace of a
testbed that bench/fanout/fanout.py brought up (tools/wan/wan.sh).

tern first: `tern-agent --root` in the first host, a member in every other
host (`--relay-only` for the dissemination shape), every version of the trace
published with `tern publish`. Per version:
  * ready_s: from `tern publish` being called to the version's object being
    ready on the root (ctime of DIR/published/<object>: written, hashed and
    signed, just before the root offers it); every time below counts from
    that moment, the one the physical bound starts at. File times come from
    the kernel's coarse clock (up to a tick, 1-10 ms, behind time.time());
    disk-to-disk differences cancel it, differences with time.time() do not;
  * publish_s: how long `tern publish` took to return (diff, encode, write,
    HEAD, and the root's own apply and syncs after it offered the object: on
    an idle machine members may hold the object before it returns);
  * first/last (status): the root's /status first showing one member / every
    member at the version (a member heartbeats the moment it holds or
    serves it: one member-to-root one-way trip plus up to one poll period);
    polled from the moment `tern publish` is called; the disk times below
    are the measure;
  * first/last (disk), what the table reports: a serving member's commit
    (mtime of DIR/views/state.json), a relay-only member's object complete
    (ctime of DIR/objects/<object>: the relay renames the .part file once
    every chunk's SHA-256 checked against the signed list);
  * the tree's critical path: the last member's chain of parents, each with
    its own disk time;
  * bytes on each WAN link: the forwarder's per-link byte counters (IP bytes,
    both directions, everything that crossed) before and after;
  * CPU seconds of every agent over the version (/proc), and how busy the
    whole machine was (other engineers' work included).
Then checks every member: a serving member's DIR/current tensor by tensor
against the published checkpoint, a relay-only member's object byte for byte
against the root's.

Then the baselines on the same testbed, with nginx serving from the root's
host: (a) every island downloads the last version's full checkpoint with curl,
all at once (a star over HTTP); (d) per version the store XORs the new
checkpoint against the previous one and compresses it with zstd (the seed
system's delta), and every island fetches it with curl, decompresses it, XORs
it onto the previous version it holds and checks the SHA-256 of the result.
(c) (bench/tern_relay_blob) per version PULSE's patch of the same
checkpoints (flat index gaps + raw values, zstd -1) through the tree the
root planned above: the same relay code, chunking, push window, transport and
TLS as the agents, one process per host, after a warm-up object of the
keyframe's size (the agents' tree carried the keyframe first); a serving
member applies it (PulseApply) and checks the view's digest (the digest the
agents verify). It times from the root's Offer (tern from the patch ready, a
few ms earlier) and has no agent around the relay: no board record, no
manifest lead, no disk commit, which flatters it.
"""
import argparse
import glob
import http.client
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "agent_wan"), os.path.join(HERE, "..", "..", "tests", "cli")]
from driver import Agent, machine_cpu_s, parse_wan_config, proc_cpu_s, tensors  # noqa: E402
from pki import node_pki  # noqa: E402

HTTP_PORT = 8080
MAX_VERSIONS = 64


def region_of(host):
    return host.rsplit("-", 1)[0]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def link_stats(state_dir, regions):
    """({"us->eu": bytes, ...}, {"us->eu lost": packets, "us->eu queue_drops":
    packets, ...}): the forwarder's per-direction counters (it prints them on
    SIGUSR1; regions are numbered from 1 in config order). The drops count
    links inside a region too ("ap->ap"); the bytes do not."""
    log = os.path.join(state_dir, "fwd.log")
    size0 = os.path.getsize(log)
    os.kill(int(open(os.path.join(state_dir, "fwd.pid")).read()), signal.SIGUSR1)
    deadline = time.time() + 5
    text = ""
    while time.time() < deadline:
        time.sleep(0.05)
        with open(log) as f:
            f.seek(size0)
            text = f.read()
        if text.count("\nlink ") + text.startswith("link ") >= len(regions) * (len(regions) - 1) // 2 * 2:
            break
    out, drops = {}, {}
    for m in re.finditer(r"^link (\d+)->(\d+) .*?bytes=(\d+) lost=(\d+) queue_drops=(\d+)", text, re.M):
        a, b = int(m.group(1)), int(m.group(2))
        key = "%s->%s" % (regions[a - 1], regions[b - 1])
        if a != b:
            out[key] = int(m.group(3))
        # The forwarder's random loss and its drop-tail queue.
        drops[key + " lost"] = int(m.group(4))
        drops[key + " queue_drops"] = int(m.group(5))
    return out, drops


def link_bytes(state_dir, regions):
    return link_stats(state_dir, regions)[0]


def diff_links(after, before):
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}


# The kernel's TCP loss counters kept per version and host (/proc/net/snmp and
# /proc/net/netstat of the host's namespace): where a version was slow, did a
# stream lose packets, and did it recover by fast retransmit, a tail-loss
# probe or a retransmission timeout (RFC 6298: 200 ms or more, doubled on
# each repeat)?
TCP_COUNTERS = ("Tcp:RetransSegs", "TcpExt:TCPTimeouts", "TcpExt:TCPLossProbes", "TcpExt:TCPLossProbeRecovery",
                "TcpExt:TCPFastRetrans", "TcpExt:TCPSlowStartRetrans", "TcpExt:TCPLostRetransmit",
                "TcpExt:TCPSpuriousRTOs", "TcpExt:TCPSackRecovery")


def tcp_counters(hosts):
    """{host: {counter: value}} for TCP_COUNTERS, read in each host's namespace."""
    out = {}
    for name, ns, _ in hosts:
        r = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp", "/proc/net/netstat"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            continue
        got = {}
        lines = r.stdout.splitlines()
        # Both files are pairs of lines: a header ("Tcp: RtoAlgorithm ...")
        # then its values ("Tcp: 1 ...").
        for head, vals in zip(lines[::2], lines[1::2]):
            group, *names = head.split()
            for k, x in zip(names, vals.split()[1:]):
                if group + k in TCP_COUNTERS:
                    got[k] = int(x)
        out[name] = got
    return out


def diff_tcp(after, before):
    """Per host, the counters that grew; hosts with none left out."""
    return {h: d for h, c in after.items() if (d := diff_links(c, before.get(h, {})))}


def object_time(agent_dir, version, folder="objects"):
    """ctime of the first complete object that brings `version` into
    agent_dir/folder, or None: a relay-only member's objects (renamed from
    .part once verified), or the root's DIR/published (its patch, written
    before the keyframe of the same version)."""
    paths = glob.glob(os.path.join(agent_dir, folder, "*-%d" % version))
    return min((os.stat(p).st_ctime for p in paths), default=None)


def run_all(jobs):
    """Starts every (name, argv) at once; returns {name: (end_time, rc, stdout)}
    and the start time. Each process is waited for by its own thread."""
    out, threads = {}, []
    t0 = time.time()

    def wait(name, argv):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        so, se = p.communicate()
        out[name] = (time.time(), p.returncode, so + se)

    for name, argv in jobs:
        t = threading.Thread(target=wait, args=(name, argv))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout=900)
    return out, t0


class Nginx:
    def __init__(self, work, address):
        self.www = os.path.join(work, "www")
        os.makedirs(self.www, exist_ok=True)
        conf = os.path.join(work, "nginx.conf")
        with open(conf, "w") as f:
            f.write("user root;\nworker_processes 2;\ndaemon off;\npid %s/nginx.pid;\nerror_log %s/nginx.err;\n"
                    "events { worker_connections 1024; }\n"
                    "http { access_log off; sendfile on; tcp_nopush on; keepalive_timeout 60;\n"
                    "  client_body_temp_path %s/nginx-tmp; proxy_temp_path %s/nginx-tmp;\n"
                    "  fastcgi_temp_path %s/nginx-tmp; uwsgi_temp_path %s/nginx-tmp; scgi_temp_path %s/nginx-tmp;\n"
                    "  server { listen %s:%d; root %s; } }\n" % (work, work, *([work] * 5), address, HTTP_PORT,
                                                              self.www))
        self.proc = subprocess.Popen(["nginx", "-c", conf], stderr=subprocess.DEVNULL)
        self.url = "http://%s:%d" % (address, HTTP_PORT)
        for _ in range(100):
            try:
                urllib.request.urlopen(self.url + "/", timeout=1)
                break
            except urllib.error.HTTPError:
                break  # 403/404: it answers
            except OSError:
                time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def xor_bytes(a, b):
    n = max(len(a), len(b))
    x = int.from_bytes(a, "little") ^ int.from_bytes(b, "little")
    return x.to_bytes(n, "little")


def island_xor(base, out):
    """The island side of baseline (d): stdin is the decompressed XOR delta;
    XOR it onto BASE, write OUT, print its SHA-256."""
    h = hashlib.sha256()
    with open(base, "rb") as b, open(out, "wb") as f:
        while True:
            d = sys.stdin.buffer.read(4 << 20)
            if not d:
                break
            x = xor_bytes(b.read(len(d)), d)[:len(d)]
            f.write(x)
            h.update(x)
    print(h.hexdigest())


def run_tern(a, hosts, regions, steps, work):
    root_name, root_ns, root_addr = hosts[0]
    root_region = region_of(root_name)
    relay_only = a.shape == "relay"
    sec = ["--no-tls"] if a.no_tls else node_pki(work, [h[2] for h in hosts])
    common = [a.agent, "--heartbeat-ms", "200"] + sec + a.agent_args.split()
    agents = []
    rows = []
    try:
        root = Agent(work, root_ns, "root", common + ["--root", "--listen", root_addr + ":7400", "--admin",
                                                      "127.0.0.1:0", "--region", root_region])
        agents.append(root)
        root.wait_started()
        key = os.path.join(root.dir, "public-key.pem")
        members = []
        for name, ns, addr in hosts[1:]:
            extra = ["--relay-only"] if relay_only else []
            m = Agent(work, ns, name, common + ["--join", root_addr + ":7400", "--listen", addr + ":7400",
                                                "--region", region_of(name), "--trust-key", key] + extra)
            agents.append(m)
            members.append(m)
        for m in members:
            m.wait_started()

        def status():
            # Polled every few ms on a machine the run keeps busy: an
            # answer cut short (the admin port's guard closing a request
            # that outlasted its timeout, "busy" when its connections are
            # taken) is tried again, a few times, rather than ending a run.
            for attempt in range(5):
                try:
                    with urllib.request.urlopen("http://%s/status" % root.admin, timeout=5) as r:
                        return json.loads(r.read())
                except (OSError, http.client.HTTPException, ValueError) as e:
                    if attempt == 4:
                        raise
                    print("status of the root: %s; trying again" % e, file=sys.stderr)
                    time.sleep(0.2)

        # 90 s, and 2 s a member beyond 32, from the last agent started (64
        # members joined in 2.0-2.5 s on 2 cores, 2026-12-05; the margin is for
        # a loaded machine).
        join_s = 90 + 2 * max(0, len(members) - 32)
        t_join = last_print = time.time()
        while True:
            joined = len(status()["members"])
            if joined >= len(members):
                break
            now = time.time()
            if now > t_join + join_s:
                raise SystemExit("only %d of %d members joined in %d s" % (joined, len(members), join_s))
            if now - last_print > 10:
                last_print = now
                print("   %d of %d members joined after %.0f s (load %.1f)" % (
                    joined, len(members), now - t_join, os.getloadavg()[0]), flush=True)
            time.sleep(0.1)
        print("   %d members joined in %.1f s" % (len(members), time.time() - t_join), flush=True)
        time.sleep(1)  # the last joiner's links settle
        by_name = {m.name: m for m in members}
        for v, ckpt in enumerate(steps, start=1):
            cpu0 = {x.name: proc_cpu_s(x.proc.pid) for x in agents}
            mach0 = machine_cpu_s()
            links0, drops0 = link_stats(a.state, regions)
            tcp0 = tcp_counters(hosts)
            # The figures the root's format choice reads (its members' last
            # heartbeats): each edge's rate and round trip as the child saw them.
            figures = {m["id"]: dict(parent=m["parent"], rtt_to_parent_s=m["rtt_to_parent_s"],
                                     rate_in_bytes_per_s=m["rate_in_bytes_per_s"],
                                     last_apply_s=m["last_apply_s"]) for m in status()["members"]}
            t_start = time.time()
            # Polled while `tern publish` runs: members may hold the version
            # before the call returns (it returns after the root's own apply).
            pub = subprocess.Popen([a.tern, "publish", "--board", root.admin, ckpt, "--version", str(v)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            first = last = t_pub = None
            deadline = t_start + 600
            s = None
            while True:
                now = time.time()
                if t_pub is None and pub.poll() is not None:
                    t_pub = now
                    _, err = pub.communicate()
                    if pub.returncode != 0:
                        raise SystemExit("tern publish version %d failed: %s" % (v, err.strip()))
                    deadline = t_pub + a.deadline_s
                if now >= deadline:
                    if t_pub is None:
                        pub.kill()
                        raise SystemExit("tern publish version %d did not return in 600 s" % v)
                    break
                s = status()
                at = [m["version"] for m in s["members"]]
                if first is None and any(x >= v for x in at):
                    first = now
                if last is None and len(at) == len(members) and all(x >= v for x in at):
                    last = now
                if last is not None and t_pub is not None:
                    break
                time.sleep(a.poll_ms / 1e3)
            cpu = {x.name: proc_cpu_s(x.proc.pid) - cpu0[x.name] for x in agents}
            mach1 = machine_cpu_s()
            time.sleep(0.3)  # the last ACKs cross
            links1, drops1 = link_stats(a.state, regions)
            wan, drops = diff_links(links1, links0), diff_links(drops1, drops0)
            tcp = diff_tcp(tcp_counters(hosts), tcp0)
            if last is None:
                behind = sorted("%s at v%s (parent %s)" % (m["id"], m["version"], m["parent"])
                                for m in (s or {}).get("members", []) if m["version"] < v)
                joined = len((s or {}).get("members", []))
                why = "not held by every member within %g s: %d of %d joined, behind: %s" % (
                    a.deadline_s, joined, len(members), ", ".join(behind) or "none")
                print("tern version %d FAILED: %s" % (v, why), flush=True)
                rows.append(dict(version=v, failed=why))
                break
            # Times count from the object being ready on the root (not from
            # `tern publish` returning, which can come after members hold it).
            t_ready = object_time(root.dir, v, "published")
            if t_ready is None:
                raise SystemExit("version %d: no object in %s/published" % (v, root.dir))
            first = first - t_ready if first is not None else None
            last -= t_ready
            disk = {}
            for m in members:
                if relay_only:
                    t = object_time(m.dir, v)
                else:
                    st = os.path.join(m.dir, "views", "state.json")
                    t = os.stat(st).st_mtime if json.load(open(st))["version"] == v else None
                disk[m.name] = t - t_ready if t is not None else None
            rv = None
            for _ in range(100):
                rv = next(x for x in status()["versions"] if x["version"] == v)
                if rv["last_served_s"] >= 0 or relay_only:
                    break
                time.sleep(0.02)
            # Checked: a serving member's view, a relay-only member's object.
            if relay_only:
                root_obj = {os.path.basename(p): sha256_file(p)
                            for p in glob.glob(os.path.join(root.dir, "published", "*-%d" % v))}
                bad = []
                for m in members:
                    got = {os.path.basename(p): sha256_file(p)
                           for p in glob.glob(os.path.join(m.dir, "objects", "*-%d" % v))}
                    if not got or any(root_obj.get(k) != h for k, h in got.items()):
                        bad.append(m.name)
            else:
                want = tensors(ckpt)
                bad = [m.name for m in members if tensors(os.path.join(m.dir, "current")) != want]
            parent = {x["id"]: x["parent"] for x in s["members"]}
            known = [t for t in disk.values() if t is not None]
            last_name = max((n for n in disk if disk[n] is not None), key=lambda n: disk[n], default=None)
            path, n = [], last_name
            while n and n in by_name and len(path) < 64:
                path.append((n, disk.get(n)))
                n = parent.get(n)
            path.reverse()
            per_region = {}
            for n, t in disk.items():
                if t is not None:
                    per_region[region_of(n)] = max(per_region.get(region_of(n), 0), t)
            rows.append(dict(
                version=v, keyframe=rv["patch_bytes"] == 0, shipped=rv["patch_bytes"] or rv["keyframe_bytes"],
                view=rv["view_bytes"], publish_s=t_pub - t_start, ready_s=t_ready - t_start,
                # The root's own spans (GET /status): from the object written
                # (ready) to it offered: the board record, the hand-off (the
                # agent's lock), then OFFER and HEAD.
                offered_after_ready_s=sum((rv.get("publish") or {}).get(k, 0)
                                          for k in ("record_s", "handoff_s", "announce_s")),
                root_spans=rv.get("publish"),
                first_status=first, last_status=last,
                first_disk=min(known) if len(known) == len(members) else None,
                last_disk=max(known) if len(known) == len(members) else None,
                last_by_region=per_region, critical_path=path, wan_bytes=wan, wan_drops=drops, tcp_loss=tcp,
                cpu_s=cpu, disk=disk, machine_busy=(mach1[0] - mach0[0]) / max(mach1[1] - mach0[1], 1e-9),
                verified=len(members) - len(bad), bad=bad,
                # The root's format choice (docs/agent.md §6a) and its prediction.
                patch_format=rv.get("patch_format"), format_reason=rv.get("format_reason"),
                predicted_s={1: rv.get("predicted_f1_s"), 2: rv.get("predicted_f2_s")},
                member_figures=figures,
                load=os.getloadavg()[0]))
            print("tern version %d: %s %.3f MB format %s, ready %.3f s after publish was called (offered %.3f s "
                  "after ready; the call returned after %.3f s), last member %s %.3f s after ready; %d/%d verified; "
                  "load %.1f; %s" % (
                      v, "keyframe" if rows[-1]["keyframe"] else "patch", rows[-1]["shipped"] / 1e6,
                      rows[-1]["patch_format"], rows[-1]["ready_s"], rows[-1]["offered_after_ready_s"],
                      rows[-1]["publish_s"],
                      "holding" if relay_only else "serving", rows[-1]["last_disk"] or -1,
                      len(members) - len(bad), len(members), rows[-1]["load"], rows[-1]["format_reason"]),
                  flush=True)
            spans = rv.get("publish") or {}
            if rows[-1]["offered_after_ready_s"] > 0.05:
                print("   the root offered it late: %s" % " ".join(
                    "%s %.3f s" % (k[:-2], spans[k]) for k in ("write_s", "record_s", "handoff_s", "announce_s") if k in spans),
                      flush=True)
            if tcp or drops:
                total = {}
                for c in tcp.values():
                    for k, x in c.items():
                        total[k] = total.get(k, 0) + x
                print("   loss: forwarder %s; TCP %s; timeouts at %s" % (
                    " ".join("%s=%d" % kv for kv in sorted(drops.items())) or "none",
                    " ".join("%s=%d" % kv for kv in sorted(total.items())) or "none",
                    " ".join("%s=%d" % (h, c["TCPTimeouts"]) for h, c in sorted(tcp.items())
                             if c.get("TCPTimeouts")) or "none"), flush=True)
            if v < len(steps):
                time.sleep(a.gap_s)
        # Apply CPU per member and version, from the member's own log line.
        # A serving member held the whole object at its commit minus its
        # "applied in" (the agent's own figure from object complete to serving).
        apply_cpu, applied_in = {}, {}
        for m in members:
            for line in open(m.log_path):
                mm = re.search(r"serving version (\d+) .*process cpu ([0-9.]+) s", line)
                if mm:
                    apply_cpu.setdefault(int(mm.group(1)), {})[m.name] = float(mm.group(2))
                mm = re.search(r"serving version (\d+) .*applied in ([0-9.]+) s", line)
                if mm:
                    applied_in.setdefault(int(mm.group(1)), {})[m.name] = float(mm.group(2))
        for r in rows:
            r["apply_cpu_s"] = apply_cpu.get(r["version"], {})
            ain = applied_in.get(r["version"], {})
            r["applied_in_s"] = ain
            held = [r["disk"][n] - ain[n] for n in ain if r.get("disk", {}).get(n) is not None]
            if relay_only:
                r["held_last"] = r.get("last_disk")
            elif len(held) == len(members):
                r["held_last"] = max(held)
        final = status()
        tree = {x["id"]: x["parent"] for x in final["members"]}
        return rows, tree
    finally:
        for x in reversed(agents):
            x.stop()


def run_baselines(a, hosts, regions, steps, work):
    root_name, root_ns, root_addr = hosts[0]
    islands = hosts[1:]
    nginx = Nginx(work, root_addr)
    out = {}
    try:
        idir = os.path.join(work, "islands")
        for name, _, _ in islands:
            os.makedirs(os.path.join(idir, name), exist_ok=True)
        want = {}
        if "a" in a.baselines:
            # (a) the last version's full checkpoint (every file) to every island at once.
            ckpt = steps[-1]
            files = sorted(os.listdir(ckpt))
            dst = os.path.join(nginx.www, "full")
            os.makedirs(dst, exist_ok=True)
            for f in files:
                os.link(os.path.join(ckpt, f), os.path.join(dst, f))
                want[f] = sha256_file(os.path.join(ckpt, f))
            jobs = []
            for name, ns, _ in islands:
                argv = ["ip", "netns", "exec", ns, "curl", "-sS", "--fail"]
                for f in files:
                    argv += ["-o", os.path.join(idir, name, f), "%s/full/%s" % (nginx.url, f)]
                jobs.append((name, argv))
            links0 = link_bytes(a.state, regions)
            res, t0 = run_all(jobs)
            time.sleep(0.3)
            wan = diff_links(link_bytes(a.state, regions), links0)
            ok = [n for n, (_, rc, _) in res.items()
                  if rc == 0 and all(sha256_file(os.path.join(idir, n, f)) == want[f] for f in files)]
            done = {n: t - t0 for n, (t, _, _) in res.items()}
            per_region = {}
            for n, t in done.items():
                per_region[region_of(n)] = max(per_region.get(region_of(n), 0), t)
            out["a"] = dict(version=len(steps), bytes_per_island=sum(os.path.getsize(os.path.join(ckpt, f))
                                                                      for f in files),
                            first=min(done.values()), last=max(done.values()), last_by_region=per_region,
                            wan_bytes=wan, verified=len(ok),
                            errors=[res[n][2][-200:] for n in res if n not in ok][:3])
            print("baseline (a) full checkpoint star over HTTP: last island %.3f s; %d/%d verified" % (
                out["a"]["last"], len(ok), len(islands)), flush=True)
            for name, _, _ in islands:
                for f in files:
                    os.unlink(os.path.join(idir, name, f))
        if "d" in a.baselines:
            rows = []
            model = "model.safetensors"
            with open(os.path.join(nginx.www, "warm.bin"), "wb") as f:
                f.write(os.urandom(2 << 20))
            for v in range(2, len(steps) + 1):
                prev, new = os.path.join(steps[v - 2], model), os.path.join(steps[v - 1], model)
                t_prep = time.time()
                delta = xor_bytes(open(new, "rb").read(), open(prev, "rb").read())
                obj = os.path.join(nginx.www, "d-%d.xor.zst" % v)
                subprocess.run(["zstd", "-q", "-3", "-T1", "-f", "-o", obj], input=delta, check=True)
                prep = time.time() - t_prep
                target = hashlib.sha256(open(new, "rb").read()).hexdigest()
                jobs = []
                for name, ns, _ in islands:
                    z = os.path.join(idir, name, "d.zst")
                    sh = ('curl -sS --fail -o %s %s/d-%d.xor.zst && date +%%s.%%N && zstd -dqc %s | '
                          'python3 %s island-xor %s %s && date +%%s.%%N' % (
                              z, nginx.url, v, z, os.path.abspath(__file__), prev,
                              os.path.join(idir, name, "model")))
                    jobs.append((name, ["ip", "netns", "exec", ns, "sh", "-c", sh]))
                links0 = link_bytes(a.state, regions)
                res, t0 = run_all(jobs)
                time.sleep(0.3)
                wan = diff_links(link_bytes(a.state, regions), links0)
                fetched, applied, ok = {}, {}, 0
                for n, (_, rc, text) in res.items():
                    w = text.split()
                    if rc == 0 and len(w) >= 3:
                        fetched[n], applied[n] = float(w[0]) - t0, float(w[2]) - t0
                        ok += w[1] == target
                per_region = {}
                for n, t in fetched.items():
                    per_region[region_of(n)] = max(per_region.get(region_of(n), 0), t)
                rows.append(dict(version=v, delta_bytes=os.path.getsize(obj), prep_s=prep,
                                 last_fetched=max(fetched.values()) if len(fetched) == len(islands) else None,
                                 first_fetched=min(fetched.values()) if fetched else None,
                                 last_applied=max(applied.values()) if len(applied) == len(islands) else None,
                                 last_by_region=per_region, wan_bytes=wan, verified=ok))
                # The same fetch on a connection kept alive: a 2 MB object
                # first (slow start done), then the delta on that connection;
                # its own transfer time (curl's time_total; the islands no
                # longer start it at one instant, so this flatters (d)).
                jobs = [(name, ["ip", "netns", "exec", ns, "curl", "-sS", "--fail", "-w", "%{time_total} ",
                                "-o", "/dev/null", nginx.url + "/warm.bin", "-o", "/dev/null",
                                "%s/d-%d.xor.zst" % (nginx.url, v)]) for name, ns, _ in islands]
                res, _ = run_all(jobs)
                warm = [float(text.split()[1]) for _, rc, text in res.values() if rc == 0 and len(text.split()) == 2]
                rows[-1]["last_fetched_warm"] = max(warm) if len(warm) == len(islands) else None
                print("baseline (d) store pull, version %d: %.3f MB XOR+zstd (prepared in %.3f s), last island "
                      "fetched %.3f s (warm connection %.3f s), applied+checked %.3f s; %d/%d verified" % (
                          v, rows[-1]["delta_bytes"] / 1e6, prep, rows[-1]["last_fetched"] or -1,
                          rows[-1]["last_fetched_warm"] or -1,
                          rows[-1]["last_applied"] or -1, ok, len(islands)), flush=True)
                time.sleep(0.5)
            out["d"] = rows
    finally:
        nginx.stop()
    return out


def run_pulse_tree(a, hosts, regions, steps, tree, work):
    """Baseline (c): each version's PULSE patch (index gaps + raw values,
    zstd; bench/baselines/pulse.h) through the tree the agent's root planned
    for this testbed, by tern_relay_blob nodes: the same relay code, chunking,
    transport and TLS as the agents, another object. Serving shapes apply it
    (PulseApply) and check the view's digest; times from the root's Offer."""
    d = os.path.join(work, "pulse")
    os.makedirs(d, exist_ok=True)
    enc = subprocess.run([a.relay_blob, "encode", "--out", d] + steps, capture_output=True, text=True)
    if enc.returncode != 0:
        raise SystemExit("tern_relay_blob encode: %s" % enc.stderr.strip()[-300:])
    versions = [json.loads(l) for l in enc.stdout.splitlines() if l.strip()]
    expect = ",".join(v["digest"] for v in versions)
    root_name = hosts[0][0]
    addr = {name: address for name, _, address in hosts}
    # The agents name the root "root" in /status; its host has its own name.
    parent = {name: tree[name] if tree[name] in addr else root_name for name, _, _ in hosts[1:]}
    kids = {}
    for name in parent:
        kids[parent[name]] = kids.get(parent[name], 0) + 1
    sec = ["--no-tls"] if a.no_tls else node_pki(d, [h[2] for h in hosts])
    serving = a.shape != "relay"
    lines = []  # (name, text, unix time read)
    cv = threading.Condition()
    procs = {}

    def reader(name, p):
        for line in p.stdout:
            with cv:
                lines.append((name, line.split(), time.time()))
                cv.notify_all()

    def wait_for(pred, what, timeout, version=None, kind="held"):
        with cv:
            if cv.wait_for(pred, timeout=timeout):
                return
            # Who lacks it, and the last lines its node logged (a parent
            # that failed, a link dropped): the harness has no root to
            # re-plan around a stuck node, so say where it stuck.
            lacking = []
            if version is not None:
                have = {n for n, w, _ in lines if w[:2] == [kind, str(version)]}
                lacking = [n for n in sorted(procs) if n != root_name and n not in have]
        tails = []
        for n in lacking[:4]:
            try:
                with open(os.path.join(d, n + ".log")) as f:
                    tail = [l.strip() for l in f.readlines()[-2:] if l.strip()]
            except OSError:
                tail = []
            tails.append("%s: %s" % (n, " | ".join(t[:160] for t in tail) or "nothing logged"))
        free = shutil.disk_usage(d).free
        raise RuntimeError("baseline (c): %s not within %g s%s; %.0f MB free in the work directory" % (
            what, timeout, "; %d lack it (%s)" % (len(lacking), "; ".join(tails)) if lacking else "", free / 1e6))

    try:
        for name, ns, address in hosts:
            argv = ["ip", "netns", "exec", ns, a.relay_blob, "node", "--id", name, "--listen", address + ":7500",
                    "--children", str(kids.get(name, 0)), "--dir", os.path.join(d, name)] + sec
            if name == root_name:
                argv.append("--root")
            else:
                argv += ["--parent", addr[parent[name]] + ":7500"]
                if serving:
                    argv += ["--base", steps[0], "--expect", expect]
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=open(os.path.join(d, name + ".log"), "w"), text=True, bufsize=1)
            procs[name] = p
            threading.Thread(target=reader, args=(name, p), daemon=True).start()
        wait_for(lambda: len({n for n, w, _ in lines if w == ["ready"]}) == len(hosts), "every node ready", 90)
        rows = []
        members = [h[0] for h in hosts[1:]]
        # The agents' tree carried its keyframe (v1) before the patches: the
        # same bytes go first here, so that both measure warm connections.
        warm = os.path.join(d, "warm-1.bin")
        with open(warm, "wb") as f:
            f.write(os.urandom(sum(os.path.getsize(p) for p in glob.glob(os.path.join(steps[0], "*.safetensors")))))
        procs[root_name].stdin.write("offer 1 %s\n" % warm)
        procs[root_name].stdin.flush()
        wait_for(lambda: len({n for n, w, _ in lines if w[:2] == ["held", "1"]}) == len(members),
                 "the warm-up object at every member", a.deadline_s * 4, version=1)
        time.sleep(1)
        for v in versions:
            links0 = link_bytes(a.state, regions)
            procs[root_name].stdin.write("offer %d %s\n" % (v["version"], v["path"]))
            procs[root_name].stdin.flush()
            key = "applied" if serving else "held"
            tag = str(v["version"])

            def got(kind):
                return {n: (float(w[2]), w[3:]) for n, w, _ in lines if len(w) >= 3 and w[0] == kind and w[1] == tag}

            try:
                wait_for(lambda: len(got(key)) == len(members) and got("offered"), "version %d at every member"
                         % v["version"], a.deadline_s, version=v["version"], kind=key)
            except RuntimeError as e:
                rows.append(dict(version=v["version"], failed=str(e)))
                print(e, flush=True)
                break
            time.sleep(0.3)  # the last ACKs cross
            wan = diff_links(link_bytes(a.state, regions), links0)
            t0 = got("offered")[root_name][0]
            held = {n: t - t0 for n, (t, _) in got("held").items()}
            applied = {n: t - t0 for n, (t, _) in got("applied").items()}
            ok = sum(1 for n, (_, rest) in got("applied").items() if rest == ["ok"]) if serving else len(held)
            rows.append(dict(version=v["version"], bytes=v["bytes"], last_held=max(held.values()),
                             last_applied=max(applied.values()) if serving else None, verified=ok,
                             wan_bytes=wan))
            print("baseline (c) PULSE through the tree, version %d: %.3f MB, last member holding %.3f s%s; %d/%d "
                  "verified" % (v["version"], v["bytes"] / 1e6, rows[-1]["last_held"],
                                ", applied+checked %.3f s" % rows[-1]["last_applied"] if serving else "", ok,
                                len(members)), flush=True)
            time.sleep(0.5)
        return rows
    finally:
        for p in procs.values():
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "island-xor":
        island_xor(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description="one bench/fanout configuration (run by fanout.py)")
    ap.add_argument("--hosts", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--state", required=True, help="the testbed's state dir (/run/tern-wan/PREFIX)")
    ap.add_argument("--shape", choices=["chain", "relay", "full"], required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--versions", type=int, required=True)
    ap.add_argument("--tern", required=True)
    ap.add_argument("--agent", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--baselines", default="a d")
    ap.add_argument("--gap-s", type=float, default=2)
    ap.add_argument("--poll-ms", type=float, default=10)
    ap.add_argument("--deadline-s", type=float, default=120)
    ap.add_argument("--no-tls", action="store_true")
    ap.add_argument("--agent-args", default="")
    ap.add_argument("--relay-blob", default="", help="tern_relay_blob, for baseline (c)")
    ap.add_argument("--keep", action="store_true", help="keep the agents' data and the islands' files")
    a = ap.parse_args()
    a.baselines = a.baselines.split()
    if "c" in a.baselines and not a.relay_blob:
        raise SystemExit("baseline (c) needs --relay-blob (bench/tern_relay_blob)")
    regions, _ = parse_wan_config(a.config)
    hosts = [l.split() for l in open(a.hosts) if l.strip()]
    steps = sorted(glob.glob(os.path.join(a.trace, "step-*")))[:min(a.versions, MAX_VERSIONS)]
    os.makedirs(os.path.join(a.work, "agents"), exist_ok=True)
    rows, tree = run_tern(a, hosts, regions, steps, a.work)
    # The work directory is usually a tmpfs (run.sh --work-root): what a
    # step no longer needs goes before the next writes its own (at N=32 the
    # agents' views and objects, (d)'s island copies and (c)'s objects are
    # ~1.3 GB each; a full tmpfs failed (c) at N=32 before).
    if not a.keep:
        for name, _, _ in hosts:
            shutil.rmtree(os.path.join(a.work, "agents", name), ignore_errors=True)
    base = run_baselines(a, hosts, regions, steps, a.work) if set(a.baselines) & {"a", "d"} else {}
    if not a.keep:
        shutil.rmtree(os.path.join(a.work, "islands"), ignore_errors=True)
    if "c" in a.baselines and len(steps) > 1:
        try:
            base["c"] = run_pulse_tree(a, hosts, regions, steps, tree, a.work)
        except RuntimeError as e:  # its nodes not ready, or the warm-up not through: tern's rows stand
            print(e, flush=True)
            base["c"] = [dict(version=0, failed=str(e))]
    with open(a.out, "w") as f:
        json.dump(dict(rows=rows, tree=tree, baselines=base), f)
    bad = any("failed" in r or r["verified"] < len(hosts) - 1 for r in rows) or len(rows) < len(steps)
    bad |= any("failed" in r or r["verified"] < len(hosts) - 1 for r in base.get("c", []))
    # An island of (a) or (d) without the checkpoint bit for bit fails the
    # run too: a baseline's time is only worth comparing when it delivered.
    bad |= any(r["verified"] < len(hosts) - 1 for r in base.get("d", []) + ([base["a"]] if "a" in base else []))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
