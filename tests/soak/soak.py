#!/usr/bin/env python3
"""The fault-injection soak of tern-agent (issue 23 §5; docs/soak.md).

A real etcd, a root and a standby root over it, and members in several
regions, all `tern-agent` processes on 127.0.0.1. As a deployment runs them:
mutual TLS between the agents and etcd over TLS with client certificates
(a CA and certificates made for the run; --plain for TCP and plain HTTP
etcd); the admin ports are on loopback (the roots' with a token). Versions are
published continuously with `tern publish` while faults are injected on a
seeded schedule, one kind after another in a shuffled round:

  relay_kill   SIGKILL a member, restart it a few seconds later
  conn_drop    `ss -K` every TCP connection of a member (parent, children, root)
  stall        SIGSTOP a member past --dead-after-ms, then SIGCONT
  corrupt      restart a member whose transport flips one byte of a chunk it
               sends, below the transport checksum (TERN_TEST_FAULTS)
  tamper       restart a member whose transport rewrites every chunk it
               forwards *and* its checksum, so only the signed SHA-256 per
               chunk can catch it; it is restarted clean later
  root_kill    SIGKILL the leading root: the standby takes over through
               etcd; the old root is restarted as the new standby
  disk_full    fill the tmpfs that holds one member's DIR, free it later
  clock_skew   restart a member under libfaketime (wall clock off by more
               than --beacon-max-skew-ms), restart it with the true clock later

Then it heals everything, publishes HEAD, waits for convergence and checks:
every live member's DIR/current has HEAD's digest (`tern digest`); every
version any member served (GET /events, polled through the run, and the
"serving version" lines of its logs) is one that was published, with the
published digest; every agent's anonymous RSS and open fds are flat (the
median of the last third of its samples against the first third). It writes
report.json and report.md to --out and exits 0 only if all checks held; it
reports what it saw, never a canned pass.

With --wan CONFIG the agents run on the emulated WAN testbed instead
(tools/wan/wan.sh; tests/soak/wan.conf): one per host's network namespace,
with the config's delay, rate, loss and wire corruption between regions;
the soak enters a host's namespace only to open a socket or start a process
there (NetNs), so polling costs no process per poll.

Needs root (tmpfs mount; `ss -K` of other processes' sockets), etcd
(Debian's etcd-server), `ss` (iproute2) and libfaketime (faketime). Exit 77
(skipped) without root or etcd. Everything it starts is stopped and
everything it creates is removed on exit, Ctrl-C included.
"""
import argparse
import contextlib
import ctypes
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from etcd_server import EtcdServer, die_with_parent, free_ports, find_etcd  # noqa: E402
from pki import Ca, faketime_lib  # noqa: E402

_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, no proxy
WAN_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "wan", "wan.sh")
KINDS = ["relay_kill", "conn_drop", "stall", "corrupt", "tamper", "root_kill", "disk_full", "clock_skew"]
SKIP = 77

# Flatness bounds (docs/soak.md): a leak of a few hundred bytes per version
# or per connection over a 30-minute run shows as growth well past these,
# while the legitimate variation does not: anonymous memory moves with the
# windows in flight (a few MiB per link) and the allocator's caching.
# Sockets are not compared by count: a relay's move with its children after
# every re-plan (about 32 fds per child: a data connection of several TCP
# streams); a leaked socket shows as one its peer closed and it did not
# (CLOSE_WAIT), so those are counted instead. Each TCP stream of a data
# connection has its eventfd (transport/tcp/connection.cc), so eventfds move
# with the children too: eventfds minus sockets must stay flat (a leaked
# eventfd grows it), and the other fds (files, pipes, epoll) must too.
RSS_GROWTH_FACTOR = 1.25
RSS_GROWTH_SLACK_KB = 8 * 1024
FD_GROWTH_SLACK = 8
CLOSE_WAIT_MAX = 2


def now():
    return time.monotonic()


def http_json(url, timeout=2.0, headers=None, ns=None):
    with in_netns(ns), _HTTP.open(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
        return json.loads(r.read())


_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetNs:
    """A network namespace of the WAN testbed (tools/wan/wan.sh: one per
    host). This process enters it only while it opens a socket or starts a
    process (`with ns:`): a socket stays in the namespace it was made in, and
    a child inherits the namespace of the thread that forked it. So an
    agent's admin port is polled from inside its host at the cost of two
    setns(2) calls, not a process (`ip netns exec`) per poll, and the agents,
    `tern publish` and `ss -K` are started there the same way. The soak is
    single-threaded; entering is not nested."""
    _home = None

    def __init__(self, name):
        self.name = name
        self.fd = os.open("/run/netns/" + name, os.O_RDONLY | os.O_CLOEXEC)
        self.inside = False

    @staticmethod
    def _setns(fd, what):
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "setns(%s): %s" % (what, os.strerror(e)))

    def __enter__(self):
        assert not self.inside, "NetNs entered twice"
        if NetNs._home is None:
            NetNs._home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._setns(self.fd, self.name)
        self.inside = True
        return self

    def __exit__(self, *exc):
        self.inside = False
        self._setns(NetNs._home, "back home")  # failing here would leave us in a host: fatal, not ignored
        return False

    def close(self):
        os.close(self.fd)


def in_netns(ns):
    return ns if ns is not None else contextlib.nullcontext()


class Agent:
    """One tern-agent process (its own process group) with fixed ports, so a
    restart keeps its address and id. `incarnation` counts starts."""

    def __init__(self, soak, name, args, data_dir, region=None, root=False, ns=None, host="127.0.0.1"):
        self.soak, self.name, self.args, self.dir = soak, name, args, data_dir
        self.region, self.root = region, root
        # WAN mode: the testbed host it runs in (its network namespace and
        # address); its admin port is 127.0.0.1 inside that namespace.
        self.ns, self.host = ns, host
        self.port, self.admin_port = free_ports(2)
        self.proc = None
        self.incarnation = 0
        self.started = False  # printed its first line (a standby: leads)
        self.stopped = False  # SIGSTOPped
        self.env_extra = {}
        self.witness = False  # --witnesses: never restarted by a fault
        self.events_after = 0
        self._out = b""

    @property
    def admin(self):
        return "127.0.0.1:%d" % self.admin_port

    @property
    def address(self):
        return "%s:%d" % (self.host, self.port)

    def json(self, path, timeout=2.0):
        """GET path on its admin port (from inside its host in WAN mode)."""
        headers = {"Authorization": "Bearer soak-admin"} if self.root else None
        return http_json("http://%s%s" % (self.admin, path), timeout=timeout, headers=headers, ns=self.ns)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, env_extra=None):
        self.env_extra = dict(env_extra or {})
        self.incarnation += 1
        self.started = False
        self.stopped = False
        self.events_after = 0
        self._out = b""
        log = open(os.path.join(self.soak.logs, self.name + ".log"), "a")
        log.write("=== soak: start %d at %.1f s env %s\n" % (self.incarnation, self.soak.elapsed(),
                                                            self.env_extra))
        log.flush()
        cmd = [self.soak.agent_bin, "--listen", self.address, "--admin", self.admin, "--data", self.dir,
               "--id", self.name, "--heartbeat-ms", "200"] + self.soak.tls_flags(self.host) + self.args + \
            list(self.soak.a.agent_flag or [])
        with in_netns(self.ns):
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                         env=dict(os.environ, **self.env_extra), start_new_session=True,
                                         preexec_fn=die_with_parent)
        log.close()
        os.set_blocking(self.proc.stdout.fileno(), False)

    def poll_started(self):
        if self.started or not self.alive():
            return self.started
        try:
            chunk = os.read(self.proc.stdout.fileno(), 4096)
        except BlockingIOError:
            return False
        self._out += chunk or b""
        if b"listening on" in self._out:
            self.started = True
        return self.started

    def wait_started(self, seconds):
        deadline = now() + seconds
        while now() < deadline:
            if self.poll_started():
                return True
            if not self.alive():
                return False
            time.sleep(0.05)
        return False

    def signal(self, sig):
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self):
        if self.proc is None:
            return None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        try:
            return self.proc.wait(timeout=15)
        finally:
            self.proc.stdout.close()

    def stop(self):
        """SIGTERM, then SIGKILL after 20 s; the exit code."""
        if self.proc is None:
            return None
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=20)
                self.proc.stdout.close()
                return rc
            except subprocess.TimeoutExpired:
                self.kill()
                return "killed after 20 s"
        self.proc.stdout.close()
        return self.proc.returncode


class Soak:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.t0 = now()
        self.work = tempfile.mkdtemp(prefix="tern-soak-")
        self.logs = os.path.join(a.out, "logs")
        # A fresh set per run: an agent's lives append to its log within a
        # run, and the check reads every "serving version" line, so lines
        # left by an earlier run in the same --out would count against this
        # one (a ctest rerun: versions "served but never published").
        shutil.rmtree(self.logs, ignore_errors=True)
        os.makedirs(self.logs, exist_ok=True)
        self.agent_bin, self.tern = a.agent, a.tern
        self.etcd = None
        self.mount = None
        self.roots = []
        self.members = []
        self.published = {}  # version -> {"digest", "step", "ok", "t", "error"}
        self.digests = {}  # step index -> view digest
        self.served = []  # (t, member, incarnation, version, digest, source)
        self.samples = []  # (t, agent, incarnation, rss_anon_kb, rss_kb, fds)
        self.faults = []  # {"t", "kind", "target", ...}
        self.notes = []
        self.pending = []  # (due time, description, callable): heal actions
        self.publisher = None  # (Popen, version, started at)
        self.next_version = 1
        self.filler = None
        self.wan = None  # WAN mode: {"prefix", "hosts": [(name, region, NetNs, address)], "regions"}
        self.pki = None  # TLS: {"ca": path, address: (cert path, key path)}

    def elapsed(self):
        return now() - self.t0

    def note(self, text):
        line = "[%7.1f s] %s" % (self.elapsed(), text)
        self.notes.append(line)
        print(line, flush=True)

    # ---------------------------------------------------------------- setup
    def run_tern(self, *args, timeout=120):
        return subprocess.run([self.tern, *args], capture_output=True, text=True, timeout=timeout)

    def digest(self, path):
        r = self.run_tern("digest", path, "--threads", "1")
        if r.returncode != 0:
            raise RuntimeError("tern digest %s: %s" % (path, r.stderr.strip()))
        return r.stdout.strip().split()[-1]

    def step_of(self, version):
        """Versions walk the trace forth and back (0, 1, ..., S-1, S-2, ..., 1,
        0, 1, ...), so every version differs from the one before by one
        training step (a few % of values), however long the run."""
        s = self.a.steps
        period = 2 * (s - 1)
        i = (version - 1) % period
        return i if i < s else period - i

    def make_pki(self, addresses):
        """A CA and one certificate per host address (IP SAN, server and
        client use), for the agents' mutual TLS and etcd's. Backdated by an
        hour (openssl under libfaketime, when there is one), as a real
        fleet's certificates were issued before it started: the clock_skew
        fault sets a member's wall clock up to 300 s back, and a certificate
        issued "now" would not be valid yet on it."""
        ca = Ca(os.path.join(self.work, "pki"), "tern-soak-ca", days=3, backdate_s=3600)
        self.pki = {"ca": ca.pem}
        for i, addr in enumerate(sorted(set(addresses))):
            self.pki[addr] = ca.issue("host%d" % i, ["IP:" + addr], cn=addr)
        self.note("TLS: a CA and %d host certificate(s) in %s (backdated 1 h: %s)" %
                  (len(self.pki) - 1, ca.dir, "yes" if ca.backdated else "no, no libfaketime"))

    def tls_flags(self, address):
        """tern-agent's transport flags for an agent on this host address."""
        if self.pki is None:
            return ["--no-tls"]
        cert, key = self.pki[address]
        return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", self.pki["ca"]]

    def etcd_flags(self, address):
        """A root's etcd flags: etcd over TLS with this host's certificate as
        the client certificate, or plain HTTP (--plain; off loopback only
        with --etcd-insecure)."""
        if self.pki is None:
            return (["--board-etcd", "etcd://%s/tern/soak" % self.etcd.endpoint] +
                    (["--etcd-insecure"] if self.wan else []))
        cert, key = self.pki[address]
        return ["--board-etcd", "etcds://%s/tern/soak" % self.etcd.endpoint, "--etcd-cacert", self.pki["ca"],
                "--etcd-cert", cert, "--etcd-key", key]

    def step_path(self, i):
        return os.path.join(self.work, "trace", "step-%06d" % i)

    def setup(self):
        self.note("work dir %s, out %s, seed %d" % (self.work, self.a.out, self.a.seed))
        r = self.run_tern("datagen", "--out", os.path.join(self.work, "trace"), "--params", self.a.params,
                          "--steps", str(self.a.steps), "--lr", "1e-5", "--threads", "1", timeout=600)
        if r.returncode != 0:
            raise RuntimeError("tern datagen: " + r.stderr)
        for i in range(self.a.steps):
            self.digests[i] = self.digest(self.step_path(i))
        self.note("trace: %d steps of %s parameters" % (self.a.steps, self.a.params))
        if self.a.wan:
            self.wan_up()
        if not self.a.plain:
            self.make_pki([h[3] for h in self.wan["hosts"]] if self.wan else ["127.0.0.1"])
        etcd_host = self.wan["hosts"][0][3] if self.wan else "127.0.0.1"
        etcd_tls = None if self.pki is None else {"ca": self.pki["ca"], "cert": self.pki[etcd_host][0],
                                                  "key": self.pki[etcd_host][1]}
        if self.a.wan:
            # etcd in the first host, next to root-a; root-b reaches it over
            # the region's link.
            with self.wan["hosts"][0][2]:
                self.etcd = EtcdServer.start(self.work, host=etcd_host, tls=etcd_tls)
        else:
            self.etcd = EtcdServer.start(self.work, tls=etcd_tls)
        for name, text in (("admin.token", "soak-admin\n"), ("join.token", "soak-join\n")):
            with open(os.path.join(self.work, name), "w") as f:
                f.write(text)
        key = os.path.join(self.work, "publisher-key.pem")
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", key], check=True,
                       capture_output=True)
        root_region = self.wan["hosts"][0][1] if self.wan else "r0"
        root_args = ["--root", "--region", root_region, "--etcd-lease-s", "2", "--signing-key", key,
                     "--admin-token-file", os.path.join(self.work, "admin.token"),
                     "--join-token-file", os.path.join(self.work, "join.token")]
        for i, name in enumerate(("root-a", "root-b")):
            place = {"ns": self.wan["hosts"][i][2], "host": self.wan["hosts"][i][3]} if self.wan else {}
            args = root_args + self.etcd_flags(place.get("host", "127.0.0.1"))
            self.roots.append(Agent(self, name, args, os.path.join(self.work, name), root=True, **place))
        self.roots[0].start()
        if not self.roots[0].wait_started(60):
            raise RuntimeError("root-a did not start (logs/root-a.log)")
        self.roots[1].start()  # campaigns and waits
        join = ",".join(r.address for r in self.roots)
        member_args = ["--join", join, "--trust-key", os.path.join(self.roots[0].dir, "public-key.pem"),
                       "--join-token-file", os.path.join(self.work, "join.token")]
        # One member's DIR on a small tmpfs: the disk_full fault fills it.
        self.mount = os.path.join(self.work, "tmpfs")
        os.makedirs(self.mount)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % self.a.tmpfs_mb, "tern-soak", self.mount],
                       check=True)
        for i in range(self.a.members):
            if self.wan:  # one member in every host after the roots', named after it
                host, region, ns, addr = self.wan["hosts"][i + 2]
                name, region_name, place = "m%d-%s" % (i, host), region, {"ns": ns, "host": addr}
            else:
                name, region, region_name, place = ("m%d-r%d" % (i, i % self.a.regions), i % self.a.regions,
                                                    "r%d" % (i % self.a.regions), {})
            data = os.path.join(self.mount, name) if i == self.a.members - 1 else os.path.join(self.work, name)
            m = Agent(self, name, member_args + ["--region", region_name], data, region=region, **place)
            self.members.append(m)
            m.start()
        for m in self.members:
            if not m.wait_started(60):
                raise RuntimeError("%s did not start (logs/%s.log)" % (m.name, m.name))
        self.tmpfs_member = self.members[-1]
        # Witnesses: the first member of each region in turn (never the
        # tmpfs one), up to --witnesses. Faults that restart a member pass
        # them by, so that their lives span the run and their memory and fds
        # can be judged; they still see every fault around them (parents
        # killed, stalled, lying, connections dropped, the root replaced).
        by_region = {}
        for m in self.members[:-1]:
            by_region.setdefault(m.region, []).append(m)
        order = [m for rank in range(len(self.members)) for ms in by_region.values() for m in ms[rank:rank + 1]]
        for m in order[:self.a.witnesses]:
            m.witness = True
        if self.a.witnesses:
            self.note("witnesses (never restarted by a fault): " +
                      ", ".join(m.name for m in self.members if m.witness))
        self.note("etcd %s%s, roots %s (standby %s), %d members in %d regions%s, %s on a %d MiB tmpfs" %
                  (self.etcd.endpoint, " (plain)" if self.pki is None else " (TLS, client certificates)",
                   self.roots[0].address, self.roots[1].address, len(self.members),
                   self.a.regions, " (WAN testbed %s)" % self.wan["prefix"] if self.wan else "",
                   self.tmpfs_member.name, self.a.tmpfs_mb))

    def wan_up(self):
        """Brings the testbed of --wan up (tools/wan/wan.sh): one agent per
        host, the roots in the first region's first two hosts, a member in
        every other host; --members and --regions follow from the config."""
        prefix = "tw-soak%x" % (os.getpid() & 0xfffff)
        self.wan = {"prefix": prefix, "hosts": [], "config": open(self.a.wan).read()}  # down even if up fails
        r = subprocess.run([WAN_SH, "up", self.a.wan, "--prefix", prefix], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise RuntimeError("wan.sh up %s: %s" % (self.a.wan, r.stderr.strip()[-600:]))
        for line in open("/run/tern-wan/%s/hosts" % prefix):
            host, ns, addr = line.split()
            self.wan["hosts"].append((host, host.rsplit("-", 1)[0], NetNs(ns), addr))
        hosts = self.wan["hosts"]
        regions = sorted({h[1] for h in hosts}, key=[h[1] for h in hosts].index)
        if len(hosts) < 4 or sum(1 for h in hosts if h[1] == regions[0]) < 2:
            raise RuntimeError("--wan: want at least 2 hosts in the first region (the roots) and 4 in all")
        self.a.members, self.a.regions = len(hosts) - 2, len(regions)
        if self.a.witnesses >= self.a.members - 1:
            raise RuntimeError("--witnesses %d: this testbed has %d members" % (self.a.witnesses, self.a.members))
        self.wan["regions"] = regions
        self.note("WAN testbed %s up: %s" % (prefix, ", ".join("%s %s" % (h[0], h[3]) for h in hosts)))

    def wan_stats(self):
        """The forwarder's per-link counters (packets offered, lost, dropped)."""
        r = subprocess.run([WAN_SH, "stats", self.wan["prefix"]], capture_output=True, text=True, timeout=30)
        return r.stdout.strip() or r.stderr.strip()

    # --------------------------------------------------------- observation
    def leader(self):
        for r in self.roots:
            if r.alive() and r.poll_started():
                return r
        return None

    def sample(self):
        t = self.elapsed()
        close_wait_inodes = {}  # network namespace -> inodes of its CLOSE_WAIT sockets
        for x in self.roots + self.members:
            # A standby is judged from when it leads (it waits with almost
            # nothing mapped before).
            if not x.alive() or not x.poll_started():
                continue
            try:
                status = open("/proc/%d/status" % x.proc.pid).read()
                anon = int(re.search(r"RssAnon:\s+(\d+)", status).group(1))
                rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
                fd_dir = "/proc/%d/fd" % x.proc.pid
                links = []
                for fd in os.listdir(fd_dir):
                    try:
                        links.append(os.readlink(os.path.join(fd_dir, fd)))
                    except OSError:
                        pass  # closed meanwhile
                fds = len(links)
                sockets = {link[8:-1] for link in links if link.startswith("socket:[")}
                eventfds = sum(1 for link in links if link == "anon_inode:[eventfd]")
                # Its CLOSE_WAIT sockets, from its own namespace's table (no
                # `ss` process per sample, on loopback or in the testbed).
                netns = os.readlink("/proc/%d/ns/net" % x.proc.pid)
                if netns not in close_wait_inodes:
                    close_wait_inodes[netns] = self.close_wait_inodes(x.proc.pid)
                close_wait = len(sockets & close_wait_inodes[netns])
            except (OSError, AttributeError):
                continue
            self.samples.append((t, x.name, x.incarnation, anon, rss, fds, fds - len(sockets) - eventfds,
                                 close_wait, eventfds - len(sockets)))

    @staticmethod
    def close_wait_inodes(pid):
        """Inodes of the TCP sockets in CLOSE_WAIT (state 08) in pid's network namespace."""
        out = set()
        for table in ("tcp", "tcp6"):
            try:
                with open("/proc/%d/net/%s" % (pid, table)) as f:
                    next(f, None)
                    for line in f:
                        w = line.split()
                        if len(w) > 9 and w[3] == "08":
                            out.add(w[9])
            except OSError:
                pass
        return out

    def poll_events(self):
        t = self.elapsed()
        for x in self.members + self.roots:
            if not x.alive() or x.stopped or not x.started:
                continue
            try:
                j = x.json("/events?after=%d&max=256&timeout_ms=0" % x.events_after)
            except (OSError, ValueError):
                continue
            if j.get("restarted"):
                self.note("%s: event seqs restarted" % x.name)
            for e in j.get("events", []):
                if e.get("kind") == "version_served" and not x.root:
                    self.served.append((t, x.name, x.incarnation, e["version"], e["digest"], "events"))
                if e.get("kind") == "version_published" and x.root:
                    p = self.published.get(e["version"])
                    if p is not None:
                        p["root_digest"] = e["digest"]
                        p["root"] = x.name
            x.events_after = j.get("next", x.events_after)

    # ---------------------------------------------------------- publishing
    def publish_tick(self):
        if self.publisher is not None:
            proc, v, t_start = self.publisher
            if proc.poll() is None:
                if now() - t_start > 120:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    self.published[v]["error"] = "tern publish killed after 120 s"
                    self.publisher = None
                return False
            out, err = proc.communicate()
            p = self.published[v]
            p["ok"] = proc.returncode == 0
            p["seconds"] = round(now() - t_start, 2)
            if not p["ok"]:
                p["error"] = (err or out).strip()[-300:]
            self.publisher = None
            return True
        return False

    def publish(self, wait=False):
        """Starts `tern publish` of the next version on the leading root (none
        while no root leads); with wait, also waits for it."""
        leader = self.leader()
        if leader is None or self.publisher is not None:
            return None
        v = self.next_version
        self.next_version += 1
        step = self.step_of(v)
        self.published[v] = {"digest": self.digests[step], "step": step, "ok": None, "t": round(self.elapsed(), 1),
                             "root": leader.name}
        with in_netns(leader.ns):  # its admin port is loopback in its host
            proc = subprocess.Popen([self.tern, "publish", "--board", leader.admin, self.step_path(step),
                                     "--version", str(v), "--token-file", os.path.join(self.work, "admin.token")],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True, preexec_fn=die_with_parent)
        self.publisher = (proc, v, now())
        if wait:
            while not self.publish_tick():
                time.sleep(0.1)
        return v

    # --------------------------------------------------------------- faults
    def member_pick(self, exclude=(), restarts=True):
        """A member free for a fault; a witness only for faults that do not
        restart it (conn_drop, stall)."""
        c = [m for m in self.members if m.alive() and not m.stopped and not m.env_extra and m not in exclude
             and m.name not in self.busy() and not (restarts and m.witness)]
        return self.rng.choice(c) if c else None

    def hold(self):
        """How long a lasting fault (a liar, a full disk, a skewed clock) lasts."""
        return self.rng.uniform(self.a.hold_s, 2 * self.a.hold_s)

    def busy(self):
        return {d.split(":")[0] for _, d, _ in self.pending}

    def later(self, seconds, what, fn):
        self.pending.append((now() + seconds, what, fn))

    def restart(self, m, env=None):
        if m.alive():
            m.kill()
        m.start(env)
        if not m.wait_started(60):
            self.note("%s did not start again (see its log)" % m.name)

    def children_of(self):
        """member -> number of children, from the leader's status (best effort)."""
        leader = self.leader()
        if leader is None:
            return {}
        try:
            j = leader.json("/status")
        except (OSError, ValueError):
            return {}
        n = {}
        for m in j.get("members", []):
            n[m.get("parent", "")] = n.get(m.get("parent", ""), 0) + 1
        return n

    def inject(self, kind):
        rec = {"t": round(self.elapsed(), 1), "kind": kind}
        children = self.children_of()
        # Faults on the data path hit a relay (a member with children) when
        # there is one, so that they are faults on a relay, not on a leaf.
        relays = [m for m in self.members if children.get(m.name)]
        if kind in ("relay_kill", "conn_drop", "stall", "corrupt", "tamper"):
            restarts = kind not in ("conn_drop", "stall")
            m = (self.member_pick(exclude=[x for x in self.members if x not in relays], restarts=restarts) or
                 self.member_pick(restarts=restarts))
            if m is None:
                return None
            rec["target"], rec["children"] = m.name, children.get(m.name, 0)
        if kind == "relay_kill":
            m.kill()
            down_s = self.rng.uniform(1, 6)
            rec["down_s"] = round(down_s, 1)
            self.later(down_s, m.name + ": restart", lambda m=m: self.restart(m))
        elif kind == "conn_drop":
            rec["connections"] = self.drop_connections(m)
        elif kind == "stall":
            stall_s = self.rng.uniform(2, 8)
            rec["stall_s"] = round(stall_s, 1)
            m.signal(signal.SIGSTOP)
            m.stopped = True

            def cont(m=m):
                m.signal(signal.SIGCONT)
                m.stopped = False
            self.later(stall_s, m.name + ": SIGCONT", cont)
        elif kind == "corrupt":
            policy = "seed=%d,corrupt_at_byte=%d" % (self.rng.randrange(1 << 30), self.rng.randrange(1 << 18))
            rec["policy"] = policy
            self.make_relay(m, {"TERN_TEST_FAULTS": policy}, rec)
            self.later(self.hold(), m.name + ": restart clean", lambda m=m: self.restart(m))
        elif kind == "tamper":
            policy = "seed=%d,tamper_at_byte=%d,tamper_chunks=4294967295" % (self.rng.randrange(1 << 30),
                                                                           self.rng.randrange(1 << 16))
            rec["policy"] = policy
            self.make_relay(m, {"TERN_TEST_FAULTS": policy}, rec)
            self.later(self.hold(), m.name + ": restart clean", lambda m=m: self.restart(m))
        elif kind == "root_kill":
            leader = self.leader()
            standby = [r for r in self.roots if r is not leader][0]
            if leader is None or not standby.alive() or "root" in "".join(self.busy()):
                return None
            rec["target"] = leader.name
            killed = now()
            leader.kill()
            # The publisher may be mid-publish on the dead root: its outcome is
            # what it reports (a version the record of which reached etcd may
            # be on the board although `tern publish` failed).
            took = standby.wait_started(30)
            rec["standby_led_s"] = round(now() - killed, 2) if took else None
            if not took:
                self.note("standby %s did not lead within 30 s of the SIGKILL" % standby.name)
            self.later(self.rng.uniform(2, 8), "root: %s restart as standby" % leader.name,
                       lambda r=leader: r.start())
        elif kind == "disk_full":
            m = self.tmpfs_member
            if m.name in self.busy() or m.env_extra:
                return None
            rec["target"] = m.name
            rec["filled_bytes"] = self.fill_disk()
            hold_s = self.hold()
            rec["hold_s"] = round(hold_s, 1)
            self.later(hold_s, m.name + ": free the disk", self.free_disk)
        elif kind == "clock_skew":
            lib = faketime_lib()
            m = self.member_pick(exclude=[self.tmpfs_member])
            if lib is None or m is None:
                rec["skipped"] = "no libfaketime" if lib is None else "no member free"
                self.faults.append(rec)
                return rec
            skew_s = self.rng.choice([-1, 1]) * self.rng.randint(45, 300)
            rec["target"], rec["skew_s"] = m.name, skew_s
            # Only the wall clock is skewed (a member whose NTP is off); its
            # monotonic clock, which drives timeouts, stays true.
            self.restart(m, {"LD_PRELOAD": lib, "FAKETIME": "%+ds" % skew_s,
                             "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_DONT_RESET": "1"})
            self.later(self.hold(), m.name + ": restart with the true clock",
                       lambda m=m: self.restart(m))
        self.faults.append(rec)
        self.note("fault %s" % json.dumps(rec))
        return rec

    def joined(self, m, seconds):
        deadline = now() + seconds
        while now() < deadline:
            try:
                if m.json("/status").get("joined"):
                    return True
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        return False

    def make_relay(self, m, env, rec):
        """Restarts m with `env` and then the other members of its region,
        so that they join after it and the planner puts them below it
        (docs/topology.md rule 9): a faulty transport only matters on a relay."""
        self.restart(m, env)
        self.joined(m, 30)
        others = [x for x in self.members if x.region == m.region and x is not m and x.alive()
                  and not x.stopped and not x.env_extra and x.name not in self.busy() and not x.witness]
        for x in others:
            self.restart(x)
        for x in others:
            self.joined(x, 30)
        rec["region_rejoined"] = [x.name for x in others]
        rec["children_after"] = self.children_of().get(m.name, 0)

    def drop_connections(self, m):
        """Kills (ss -K) every established TCP socket of m's process, which
        resets its peers' ends too."""
        with in_netns(m.ns):
            r = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True)
        ports = set()
        for line in r.stdout.splitlines():
            if "pid=%d," % m.proc.pid in line:
                local = line.split()[2]
                ports.add(local.rsplit(":", 1)[1])
        if not ports:
            return 0
        expr = " or ".join("sport = :%s" % p for p in sorted(ports))
        with in_netns(m.ns):
            k = subprocess.run(["ss", "-K", "-tnH", "state", "established", "( %s )" % expr],
                               capture_output=True, text=True)
        return len([x for x in k.stdout.splitlines() if x.strip()])

    def fill_disk(self):
        self.filler = os.path.join(self.mount, "filler")
        n = 0
        with open(self.filler, "wb") as f:
            block = b"\0" * (1 << 20)
            try:
                while True:
                    f.write(block)
                    f.flush()
                    n += len(block)
            except OSError:
                pass
        try:  # the last partial MiB too
            with open(self.filler, "ab") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
                    n += 4096
        except OSError:
            pass
        return n

    def free_disk(self):
        if self.filler and os.path.exists(self.filler):
            os.unlink(self.filler)
        self.filler = None

    def run_pending(self, everything=False):
        keep = []
        for due, what, fn in self.pending:
            if everything or now() >= due:
                self.note("heal: " + what)
                fn()
            else:
                keep.append((due, what, fn))
        self.pending = keep

    # ----------------------------------------------------------------- run
    def loop(self, until):
        kinds = []
        next_fault = now() + self.a.fault_every_s / 2
        next_publish = now()
        next_sample = now()
        while now() < until:
            self.publish_tick()
            if now() >= next_publish and self.publisher is None:
                if self.publish() is not None:
                    next_publish = now() + self.a.publish_every_s
            self.run_pending()
            if now() >= next_fault:
                if not kinds:
                    kinds = list(self.a.kinds)
                    self.rng.shuffle(kinds)
                kind = kinds.pop()
                if kind == "root_kill" and 0 <= self.a.root_kills <= sum(
                        1 for f in self.faults if f["kind"] == "root_kill" and "skipped" not in f):
                    continue  # --root-kills reached: the leader from now on lives to the end
                if self.inject(kind) is None:
                    kinds.insert(0, kind)  # not possible now (target busy): later in the round
                next_fault = now() + self.rng.uniform(0.5, 1.5) * self.a.fault_every_s
            if now() >= next_sample:
                self.sample()
                self.poll_events()
                next_sample = now() + self.a.sample_every_s
            time.sleep(0.1)

    def heal(self):
        self.note("quiesce: healing every fault")
        while self.publisher is not None:
            self.publish_tick()
            time.sleep(0.1)
        self.run_pending(everything=True)
        self.free_disk()
        for m in self.members:
            if not m.alive() or m.env_extra:
                self.note("heal: %s restart clean" % m.name)
                self.restart(m)
        if self.leader() is None:
            for r in self.roots:
                if not r.alive():
                    r.start()
            deadline = now() + 30
            while self.leader() is None and now() < deadline:
                time.sleep(0.1)
        for r in self.roots:
            if not r.alive():
                r.start()

    def converge(self):
        """Publishes HEAD after the heal and waits until every member serves it."""
        head = None
        for _ in range(3):
            v = self.publish(wait=True)
            if v is not None and self.published[v]["ok"]:
                head = v
                break
            time.sleep(2)
        if head is None:
            return None, None, {}
        t_head = now()
        deadline = t_head + self.a.converge_timeout_s
        served = {}
        while now() < deadline:
            served = {}
            for m in self.members:
                try:
                    served[m.name] = m.json("/status").get("served_version")
                except (OSError, ValueError):
                    served[m.name] = None
            self.poll_events()
            self.sample()
            if all(v == head for v in served.values()):
                return head, round(now() - t_head, 2), served
            time.sleep(0.5)
        return head, None, served

    # -------------------------------------------------------------- checks
    def log_served(self):
        """(member, version) from every 'serving version N' line of every run."""
        out = []
        for m in self.members:
            try:
                text = open(os.path.join(self.logs, m.name + ".log"), errors="replace").read()
            except OSError:
                continue
            for v in re.findall(r"serving version (\d+) ", text):
                out.append((m.name, int(v)))
        return out

    def flatness(self):
        series = {}
        for t, name, inc, anon, rss, fds, other, cw, unpaired in self.samples:
            series.setdefault((name, inc), []).append((t, anon, rss, fds, other, cw, unpaired))
        run_s = self.elapsed()
        out = []
        for (name, inc), s in sorted(series.items()):
            span = s[-1][0] - s[0][0]
            if len(s) < 12 or span < 0.4 * run_s:
                continue  # too short a life to judge a trend
            # Warm-up left out: the first keyframe, the spare view, the
            # allocator's arenas and the first children come in the first
            # fifth of a life; a leak keeps growing after it.
            s = s[len(s) // 5:]
            k = len(s) // 3
            first, last = s[:k], s[-k:]
            f_anon = statistics.median(x[1] for x in first)
            l_anon = statistics.median(x[1] for x in last)
            f_fd = statistics.median(x[3] for x in first)
            l_fd = statistics.median(x[3] for x in last)
            f_other = statistics.median(x[4] for x in first)
            l_other = statistics.median(x[4] for x in last)
            l_cw = statistics.median(x[5] for x in last)
            f_unpaired = statistics.median(x[6] for x in first)
            l_unpaired = statistics.median(x[6] for x in last)
            ok = (l_anon <= f_anon * RSS_GROWTH_FACTOR + RSS_GROWTH_SLACK_KB and
                  l_other <= f_other + FD_GROWTH_SLACK and l_cw <= CLOSE_WAIT_MAX and
                  l_unpaired <= f_unpaired + FD_GROWTH_SLACK)
            out.append({"agent": name, "incarnation": inc, "samples": len(s), "span_s": round(span, 1),
                        "rss_anon_kb_first": f_anon, "rss_anon_kb_last": l_anon,
                        "rss_kb_first": statistics.median(x[2] for x in first),
                        "rss_kb_last": statistics.median(x[2] for x in last),
                        "rss_kb_max": max(x[2] for x in s),
                        "fds_first": f_fd, "fds_last": l_fd, "fds_max": max(x[3] for x in s),
                        "other_fds_first": f_other, "other_fds_last": l_other, "close_wait_last": l_cw,
                        "eventfds_minus_sockets_first": f_unpaired, "eventfds_minus_sockets_last": l_unpaired,
                        "close_wait_max": max(x[5] for x in s), "flat": ok})
        return out

    def check(self, head, converge_s, final_served):
        published_ok = {v: p for v, p in self.published.items() if p["ok"]}
        bad_served = []
        served_failed_publish = set()
        for t, name, inc, v, d, src in self.served:
            p = self.published.get(v)
            if p is None or p["digest"] != d:
                bad_served.append({"t": round(t, 1), "member": name, "version": v, "digest": d,
                                   "published_digest": p and p["digest"]})
            elif not p["ok"]:
                served_failed_publish.add(v)
        for name, v in self.log_served():
            if v not in self.published:
                bad_served.append({"member": name, "version": v, "from": "log", "published_digest": None})
        root_digest_mismatch = [v for v, p in self.published.items()
                                if "root_digest" in p and p["root_digest"] != p["digest"]]
        current = {}
        if head is not None:
            for m in self.members:
                try:
                    current[m.name] = self.digest(os.path.join(m.dir, "current"))
                except RuntimeError as e:
                    current[m.name] = "error: %s" % e
        head_digest = self.published[head]["digest"] if head is not None else None
        bitwise = [n for n, d in current.items() if d == head_digest]
        flat = self.flatness()
        counts = {}
        for f in self.faults:
            if "skipped" not in f:
                counts[f["kind"]] = counts.get(f["kind"], 0) + 1
        checks = {
            "head_published": head is not None,
            "converged": converge_s is not None,
            "every_member_bitwise_on_head": head is not None and len(bitwise) == len(self.members),
            "only_published_versions_served": not bad_served,
            "root_digests_match": not root_digest_mismatch,
            # None: not judged (a run shorter than --flat-min-minutes shows
            # warm-up, not a trend,
            # and when no life spanned 40% of it: nothing to judge, which
            # the report says, rather than a failure or a pass).
            "memory_and_fds_flat": (all(x["flat"] for x in flat)
                                    if self.a.minutes >= self.a.flat_min_minutes and flat else None),
            "every_fault_kind_injected": all(counts.get(k) for k in self.a.kinds),
        }
        return {
            "checks": checks,
            "passed": all(v is not False for v in checks.values()),
            "head": head,
            "head_digest": head_digest,
            "converge_s": converge_s,
            "final_served": final_served,
            "members_bitwise": bitwise,
            "current_digests": current,
            "versions_attempted": len(self.published),
            "versions_published_ok": len(published_ok),
            "versions_publish_failed": {v: p.get("error") for v, p in self.published.items() if not p["ok"]},
            "served_although_publish_failed": sorted(served_failed_publish),
            "served_events": len(self.served),
            "bad_served": bad_served,
            "root_digest_mismatch": root_digest_mismatch,
            "faults_per_kind": counts,
            "faults": self.faults,
            "flatness": flat,
            "bounds": {"rss_anon_growth_factor": RSS_GROWTH_FACTOR, "rss_anon_slack_kb": RSS_GROWTH_SLACK_KB,
                       "other_fd_slack": FD_GROWTH_SLACK, "close_wait_max": CLOSE_WAIT_MAX},
        }

    # --------------------------------------------------------------- report
    def log_counts(self):
        """Lines in the agents' logs that say a fault was seen and handled."""
        pats = {"bad_chunks": r"bad chunk", "parent_reported": r"reported its parent", "demoted": r"demot",
                "parent_failed": r"parent \S+ of stripe \d+ failed", "fault_transport": r"TERN_TEST_FAULTS=",
                "catch_up": r"catch-up: ", "clock_skew": r"skew", "no_space": r"No space|ENOSPC|no space",
                # a corrupted frame header (the WAN's corrupt_pct, or a fault transport's byte)
                # (not the two kinds below, which say "corrupt: " too)
                "wire_corrupt": r"corrupt: (?!\S+: message check mismatch|control message)",
                # TCP wire version 2 caught a corrupted control message before delivery
                "message_check": r"message check mismatch",
                # a corrupted control message that reached the agent (wire version 1)
                "bad_control": r"bad control message",
                # a TLS record or handshake failed (the WAN's corrupted bytes, a connection cut mid-record)
                "tls_errors": r"TLS|SSL"}
        out = {}
        for x in self.roots + self.members:
            try:
                text = open(os.path.join(self.logs, x.name + ".log"), errors="replace").read()
            except OSError:
                continue
            out[x.name] = {k: len(re.findall(p, text)) for k, p in pats.items()}
        return out

    def witness_names(self):
        return {m.name for m in self.members if m.witness}

    def write_report(self, r):
        r["args"] = {k: v for k, v in vars(self.a).items()}
        r["elapsed_s"] = round(self.elapsed(), 1)
        r["loadavg"] = open("/proc/loadavg").read().split()[:3]
        r["log_counts"] = self.log_counts()
        r["notes"] = self.notes
        r["published"] = self.published
        r["samples"] = self.samples
        if self.wan is not None:
            r["wan"] = {k: v for k, v in self.wan.items() if k != "hosts"}
            r["wan"]["hosts"] = [(h[0], h[1], h[3]) for h in self.wan["hosts"]]
        with open(os.path.join(self.a.out, "report.json"), "w") as f:
            json.dump(r, f, indent=1, default=str)
        md = ["# tern-agent soak report", "",
              "%s: **%s** after %.0f s (seed %d, %d members in %d regions, %s parameters, publish every %.0f s, "
              "a fault every ~%.0f s, load average at the end %s)" %
              (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "PASSED" if r["passed"] else "FAILED",
               r["elapsed_s"], self.a.seed, self.a.members, self.a.regions, self.a.params, self.a.publish_every_s,
               self.a.fault_every_s, " ".join(r["loadavg"])), "",
              "Security as deployed: %s." % (
                  "**off** (--plain: plain TCP, etcd over plain HTTP)" if self.a.plain
                  else "mutual TLS between the agents, etcd over TLS with client certificates, admin ports "
                       "on loopback (the roots' with a token)"), "",
              "| check | result |", "|---|---|"]
        md += ["| %s | %s |" % (k, "not judged" if v is None else "ok" if v else "**FAILED**")
               for k, v in r["checks"].items()]
        if "wan" in r:
            md += ["", "On the WAN testbed %s (`--wan %s`): hosts %s." %
                   (r["wan"]["prefix"], self.a.wan, ", ".join("%s %s" % (h[0], h[2]) for h in r["wan"]["hosts"])),
                   "", "```", r["wan"]["config"].strip(), "```", "", "The forwarder's counters at the end:", "",
                   "```", r["wan"].get("fwd_stats", "(none)"), "```"]
        md += ["", "Versions: %d attempted, %d published (%d failed: %s); HEAD %s; converged %s s after HEAD "
               "was published; %d/%d members bit for bit on HEAD; %d version_served events checked, %d bad." %
               (r["versions_attempted"], r["versions_published_ok"], len(r["versions_publish_failed"]),
                ", ".join(str(v) for v in r["versions_publish_failed"]) or "none", r["head"], r["converge_s"],
                len(r["members_bitwise"]), self.a.members, r["served_events"], len(r["bad_served"])), "",
               "Faults per kind: " + ", ".join("%s %d" % (k, r["faults_per_kind"].get(k, 0)) for k in KINDS) +
               ". Liars that had children after their region rejoined (a liar without any forwards nothing): " +
               ", ".join("%s %d of %d" % (k, sum(1 for f in r["faults"] if f["kind"] == k and f.get("children_after")),
                                          sum(1 for f in r["faults"] if f["kind"] == k and "skipped" not in f))
                         for k in ("corrupt", "tamper")) + ".", "",
               "| agent | inc | samples | span s | RssAnon kB first→last | RSS kB first→last (max) | fds first→last (max) "
               "| other fds first→last | eventfds − sockets first→last | CLOSE_WAIT last (max) | flat |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in r["flatness"]:
            md.append("| %s%s | %d | %d | %.0f | %d→%d | %d→%d (%d) | %d→%d (%d) | %d→%d | %d→%d | %d (%d) | %s |" %
                      (x["agent"], " (witness)" if x["agent"] in self.witness_names() else "",
                       x["incarnation"], x["samples"], x["span_s"], x["rss_anon_kb_first"],
                       x["rss_anon_kb_last"], x["rss_kb_first"], x["rss_kb_last"], x["rss_kb_max"],
                       x["fds_first"], x["fds_last"], x["fds_max"], x["other_fds_first"], x["other_fds_last"],
                       x["eventfds_minus_sockets_first"], x["eventfds_minus_sockets_last"],
                       x["close_wait_last"], x["close_wait_max"], "yes" if x["flat"] else "**no**"))
        md += ["", "Bounds (first fifth of each life left out as warm-up): last third's median RssAnon <= %.2f x "
               "the first third's + %d MiB; other fds (not sockets, not eventfds) and eventfds minus sockets "
               "each <= first + %d; sockets in CLOSE_WAIT <= %d. "
               "Judged for lives of at least 40%% of the run%s." %
               (RSS_GROWTH_FACTOR, RSS_GROWTH_SLACK_KB // 1024, FD_GROWTH_SLACK, CLOSE_WAIT_MAX,
                "" if r["checks"].get("memory_and_fds_flat") is not None else
                "; not judged in this run (shorter than --flat-min-minutes, or no life that long)"),
               "", "## Faults", ""]
        md += ["* " + json.dumps(f) for f in self.faults]
        if r["bad_served"]:
            md += ["", "## Versions served that were not published", ""] + ["* " + json.dumps(b) for b in r["bad_served"]]
        md += ["", "## Log counts", "", "```", json.dumps(r["log_counts"], indent=1), "```", "", "## Timeline", "", "```"]
        md += self.notes + ["```", ""]
        with open(os.path.join(self.a.out, "report.md"), "w") as f:
            f.write("\n".join(md))

    # -------------------------------------------------------------- cleanup
    def cleanup(self):
        codes = {}
        if self.publisher is not None and self.publisher[0].poll() is None:
            os.killpg(self.publisher[0].pid, signal.SIGKILL)
            self.publisher[0].wait()
        for x in self.members + self.roots:
            try:
                codes[x.name] = x.stop()
            except Exception as e:  # keep cleaning up whatever happens
                codes[x.name] = "stop failed: %s" % e
                try:
                    x.kill()
                except Exception:
                    pass
        if self.etcd is not None:
            self.etcd.kill()
        if self.wan is not None:
            try:
                self.wan["fwd_stats"] = self.wan_stats()
            except Exception as e:
                self.wan["fwd_stats"] = "wan.sh stats failed: %r" % e
            for h in self.wan["hosts"]:
                h[2].close()
            subprocess.run([WAN_SH, "down", self.wan["prefix"]], capture_output=True, timeout=120)
        if self.mount is not None and os.path.ismount(self.mount):
            subprocess.run(["umount", "-l", self.mount])
        if self.a.keep_work:
            self.note("work dir kept: %s" % self.work)
        else:
            shutil.rmtree(self.work, ignore_errors=True)
        return codes


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.join(here, "..", "..", "build", "release", "tools")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Example: sudo tests/soak/soak.py --minutes 30 --seed 1 --out /tmp/soak")
    p.add_argument("--tern", default=os.path.join(build, "tern"), help="the tern binary")
    p.add_argument("--agent", default=os.path.join(build, "tern-agent"), help="the tern-agent binary")
    p.add_argument("--minutes", type=float, default=30, help="how long faults are injected (default 30)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    p.add_argument("--members", type=int, default=8, help="members (default 8)")
    p.add_argument("--regions", type=int, default=3, help="regions the members are spread over (default 3)")
    p.add_argument("--out", required=True, help="directory for report.json, report.md and logs/")
    p.add_argument("--params", default="2M", help="datagen model size (default 2M)")
    p.add_argument("--steps", type=int, default=8, help="datagen steps that versions walk over (default 8)")
    p.add_argument("--publish-every-s", type=float, default=5, help="seconds between publishes (default 5)")
    p.add_argument("--fault-every-s", type=float, default=20, help="mean seconds between faults (default 20)")
    p.add_argument("--hold-s", type=float, default=15,
                   help="a lasting fault (tamper, corrupt, disk_full, clock_skew) lasts 1-2x this (default 15)")
    p.add_argument("--sample-every-s", type=float, default=2, help="RSS/fd/events sampling period (default 2)")
    p.add_argument("--converge-timeout-s", type=float, default=180, help="after HEAD (default 180)")
    p.add_argument("--tmpfs-mb", type=int, default=40, help="the disk_full member's tmpfs (default 40)")
    p.add_argument("--flat-min-minutes", type=float, default=10,
                   help="judge RSS/fd flatness only in runs at least this long (default 10; shorter runs "
                        "record the samples)")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help="fault kinds to inject, comma-separated (default all: %(default)s)")
    p.add_argument("--plain", action="store_true",
                   help="plain TCP between the agents (--no-tls) and plain HTTP to etcd, instead of mutual TLS "
                        "and etcd over TLS with client certificates")
    p.add_argument("--keep-work", action="store_true", help="keep the agents' data directories")
    p.add_argument("--agent-flag", action="append", metavar="FLAG",
                   help="one more flag for every tern-agent, as one word (repeatable; e.g. "
                        "--agent-flag=--min-wire-version=2)")
    p.add_argument("--witnesses", type=int, default=0,
                   help="members that no fault restarts (conn_drop and stall still hit them), so that "
                        "lives spanning the run are judged flat (default 0)")
    p.add_argument("--root-kills", type=int, default=-1,
                   help="at most this many root_kill faults (the first rounds'), so that the last "
                        "leader's life spans most of the run and is judged (default -1: no limit)")
    p.add_argument("--wan", metavar="CONFIG",
                   help="run on the emulated WAN testbed of this config (tools/wan/wan.sh; e.g. "
                        "tests/soak/wan.conf): one agent per host, the roots in the first region's first two "
                        "hosts; --members and --regions then follow from the config")
    p.add_argument("--fwd", default=os.path.join(build, "wan", "tern-wan-fwd"),
                   help="the testbed's forwarder (with --wan)")
    a = p.parse_args()
    if a.members < 2 or a.regions < 1 or a.steps < 2:
        p.error("--members >= 2, --regions >= 1, --steps >= 2")
    if not 0 <= a.witnesses < a.members - 1 or a.root_kills < -1:
        p.error("--witnesses in 0..members-2 (the tmpfs member and one more stay faultable), --root-kills >= -1")
    a.kinds = [k for k in a.kinds.split(",") if k]
    if not a.kinds or any(k not in KINDS for k in a.kinds):
        p.error("--kinds: a comma-separated subset of " + ",".join(KINDS))
    if os.geteuid() != 0:
        print("SKIP: needs root (tmpfs mount, ss -K)")
        return SKIP
    if find_etcd() is None:
        print("SKIP: no etcd binary (Debian's etcd-server, or TERN_ETCD)")
        return SKIP
    for b in (a.tern, a.agent) + ((a.fwd,) if a.wan else ()):
        if not os.access(b, os.X_OK):
            p.error("not executable: %s" % b)
    if a.wan:
        a.wan = os.path.abspath(a.wan)
        os.environ["TERN_WAN_FWD"] = os.path.abspath(a.fwd)
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    soak = Soak(a)
    stopping = []

    def on_signal(sig, _frame):
        stopping.append(sig)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_signal)
    report = None
    try:
        soak.setup()
        soak.loop(now() + a.minutes * 60)
        soak.heal()
        head, converge_s, final_served = soak.converge()
        report = soak.check(head, converge_s, final_served)
    except KeyboardInterrupt:
        soak.note("interrupted")
    except Exception as e:  # report what happened, then clean up
        soak.note("soak error: %r" % e)
        traceback.print_exc()
    finally:
        codes = soak.cleanup()
    if report is None:
        report = {"checks": {"completed": False}, "passed": False, "head": None, "converge_s": None,
                  "versions_attempted": len(soak.published), "versions_published_ok": 0,
                  "versions_publish_failed": {}, "members_bitwise": [], "served_events": len(soak.served),
                  "bad_served": [], "faults_per_kind": {}, "flatness": [], "faults": soak.faults}
    report["exit_codes"] = codes
    soak.write_report(report)
    print("soak %s: report in %s/report.md" % ("PASSED" if report["passed"] else "FAILED", a.out))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
