#!/usr/bin/env python3
"""`tern-agent`, `tern publish` and `tern status` as processes on 127.0.0.1.

Usage: test_agent.py PATH_TO_TERN PATH_TO_TERN_AGENT. A root and three
members (two regions) over mutual TLS: versions published with `tern
publish` reach every member's DIR/current bit for bit (`tern digest` and a
byte compare); `tern status --json` lists every member with its version; a
stale version is refused with a clear message; a publish without the admin
token is refused; a member with a wrong join token is refused and serves
nothing; a member killed with SIGKILL and restarted catches up; every agent
stops cleanly on SIGTERM. The admin port over TLS (https://, --admin-cacert)
and its secure defaults, and with client certificates (--admin-tls-client-ca,
--admin-cert). Over a real etcd (skipped without one): the root
killed with SIGKILL while a standby root waits; the standby leads within
its lease plus a margin, loses nothing, and versions published to it reach
every member bit for bit. Key rotation: a board moved from key A to key
B by a signed key set that revokes A; members apply B's versions and
refuse A's. A supersede: the recovery from a wrong version number, followed
by every member, one of them stopped during it.
"""
import filecmp
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

from etcd_server import EtcdServer, die_with_parent, free_ports
from pki import Ca, node_pki

TERN = None
AGENT = None
# The roots' etcd lease in the standby tests. A leader refreshes it every
# lease/3; a lease of 2 s lapsed whenever a loaded machine running sanitized
# agents starved the refresh for 2 s, and the standby took over while the
# test said A leads. A takeover after SIGKILL waits one lease longer.
ETCD_LEASE_S = 5


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_signing_keys(d, names):
    """Ed25519 key pairs NAME.pem / NAME.pub in a new directory d; returns
    a function from a file name to its path there."""
    os.makedirs(d)
    for k in names:
        openssl("genpkey", "-algorithm", "ed25519", "-out", k + ".pem", cwd=d)
        openssl("pkey", "-in", k + ".pem", "-pubout", "-out", k + ".pub", cwd=d)
    return lambda name: os.path.join(d, name)


def read(path):
    with open(path) as f:
        return f.read()


def wait_for(cond, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


class Agent:
    """One tern-agent process in its own process group; its address is read
    from its first line. A standby root prints that line only once it leads:
    start it with wait=False and call poll_started or wait_started later."""

    def __init__(self, tmp, name, args, env=None, listen="127.0.0.1:0", wait=True):
        self.name = name
        self.dir = os.path.join(tmp, name)
        self.log = open(os.path.join(tmp, name + ".log"), "w")
        tls = ["--tls-cert", os.path.join(tmp, "node.pem"), "--tls-key", os.path.join(tmp, "node.key"),
               "--tls-ca", os.path.join(tmp, "ca.pem")]
        self.proc = subprocess.Popen([AGENT, "--listen", listen, "--data", self.dir, "--id", name,
                                      "--heartbeat-ms", "100"] + tls + args,
                                     stdout=subprocess.PIPE, stderr=self.log,
                                     env=dict(os.environ, **(env or {})), start_new_session=True,
                                     preexec_fn=die_with_parent)
        self._out = b""
        self.startup_line = None
        self.started_at = None  # time.time() when the first line came
        self.address = self.admin = None
        if wait:
            self.wait_started(60)

    def poll_started(self, seconds=0):
        """The first line if it has come within `seconds` ('' if the agent
        exited without one), else None. Reads the pipe with select rather
        than on a thread: preexec_fn is only safe without threads."""
        deadline = time.time() + seconds
        fd = self.proc.stdout.fileno()
        while self.startup_line is None:
            if not select.select([fd], [], [], max(0, deadline - time.time()))[0]:
                return None
            chunk = os.read(fd, 4096)
            self._out += chunk
            if not chunk or b"\n" in self._out:
                self.started_at = time.time()
                self.startup_line = self._out.split(b"\n")[0].decode(errors="replace")
        return self.startup_line

    def wait_started(self, seconds):
        line = self.poll_started(seconds)
        m = re.search(r"listening on (\S+?)(,|$)", line or "")
        if not m:
            self.kill()
            raise AssertionError("tern-agent %s did not start within %d s: %r (log %s)" %
                                 (self.name, seconds, line, self.log.name))
        self.address = m.group(1)
        m = re.search(r"admin http://(\S+)", line)
        self.admin = m.group(1) if m else None
        m = re.search(r"admin (https://\S+)", line)
        self.admin = m.group(1) if m else self.admin

    def kill(self):
        """SIGKILL to the process group: no goodbye, no resign."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.proc.wait(timeout=10)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError("tern-agent did not stop on signal %d" % sig)
        return self.proc.returncode


class AgentCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp_ctx = tempfile.TemporaryDirectory(prefix="tern-agent-cli-")
        cls.tmp = cls.tmp_ctx.name
        node_pki(cls.tmp)
        subprocess.run([TERN, "datagen", "--out", os.path.join(cls.tmp, "trace"), "--params", "2M",
                        "--steps", "4", "--lr", "1e-5", "--threads", "1"], check=True, capture_output=True)
        with open(os.path.join(cls.tmp, "join.token"), "w") as f:
            f.write("s3cret-join\n")
        with open(os.path.join(cls.tmp, "admin.token"), "w") as f:
            f.write("s3cret-admin\n")

    @classmethod
    def tearDownClass(cls):
        cls.tmp_ctx.cleanup()

    def step(self, n):
        return os.path.join(self.tmp, "trace", "step-%06d" % n)

    def token_root(self, name):
        """A root in region us with the class's join and admin tokens."""
        return Agent(self.tmp, name, ["--root", "--region", "us", "--admin", "127.0.0.1:0",
                                      "--admin-token-file", os.path.join(self.tmp, "admin.token"),
                                      "--join-token-file", os.path.join(self.tmp, "join.token")])

    def joining(self, root, region="eu"):
        """A member's flags to join `root` (as token_root started it)."""
        return ["--join", root.address, "--trust-key", os.path.join(root.dir, "public-key.pem"),
                "--region", region, "--join-token-file", os.path.join(self.tmp, "join.token")]

    def publish(self, root, path, version, token=True):
        args = [TERN, "publish", "--board", root.admin, path, "--version", str(version)]
        if token:
            args += ["--token-file", os.path.join(self.tmp, "admin.token")]
        return subprocess.run(args, capture_output=True, text=True, timeout=120)

    def status(self, root):
        r = subprocess.run([TERN, "status", "--board", root.admin, "--json"], capture_output=True, text=True,
                           timeout=30, check=True)
        return json.loads(r.stdout)

    def served(self, root):
        return {m["id"]: m["version"] for m in self.status(root)["members"]}

    def all_at(self, root, version, count):
        """The root lists `count` members, each serving `version` (not only
        those listed now: one dropped for missed heartbeats is missing)."""
        served = self.served(root)
        return len(served) == count and all(x == version for x in served.values())

    @staticmethod
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

    def same_bytes(self, member_dir, checkpoint):
        """Every tensor bit for bit (file layout and metadata may differ: a
        member that started from a keyframe writes its own files)."""
        return self.tensors(os.path.join(member_dir, "current")) == self.tensors(checkpoint)

    def test_publish_status_catch_up_and_refusals(self):
        tok = ["--join-token-file", os.path.join(self.tmp, "join.token")]
        root = Agent(self.tmp, "root", ["--root", "--region", "us", "--admin", "127.0.0.1:0",
                                        "--admin-token-file", os.path.join(self.tmp, "admin.token")] + tok)
        agents = [root]
        try:
            key = os.path.join(root.dir, "public-key.pem")
            self.assertTrue(os.path.exists(key))
            # The private key it generated is the owner's only, from its creation.
            private = os.stat(os.path.join(root.dir, "signing-key.pem"))
            self.assertEqual(private.st_mode & 0o777, 0o600)
            common = ["--join", root.address, "--trust-key", key]
            members = {}
            for name, region in (("eu-1", "eu"), ("eu-2", "eu"), ("ap-1", "ap")):
                members[name] = Agent(self.tmp, name, common + tok + ["--region", region])
                agents.append(members[name])
            wait_for(lambda: len(self.served(root)) == 3, 30, "three members joined")

            # A member with the wrong token is refused and serves nothing.
            with open(os.path.join(self.tmp, "bad.token"), "w") as f:
                f.write("wrong\n")
            bad = Agent(self.tmp, "bad", common + ["--region", "eu", "--join-token-file",
                                                   os.path.join(self.tmp, "bad.token")])
            agents.append(bad)

            for v in (1, 2):
                r = self.publish(root, self.step(v - 1), v)
                self.assertEqual(r.returncode, 0, r.stderr)
                wait_for(lambda: self.all_at(root, v, len(members)), 60, "version %d served" % v)
                for name, m in members.items():
                    self.assertTrue(self.same_bytes(m.dir, self.step(v - 1)), "%s at version %d" % (name, v))
            self.assertNotIn("bad", self.served(root))
            self.assertFalse(os.path.exists(os.path.join(bad.dir, "current")))
            def refused():
                with open(root.log.name) as f:
                    return "refused a join" in f.read() and "bad join token" in open(root.log.name).read()
            wait_for(refused, 10, "the root to log the refused join")

            # Refusals: a stale version, a publish without the token.
            r = self.publish(root, self.step(2), 2)
            self.assertEqual(r.returncode, 1)
            self.assertIn("not newer than HEAD", r.stderr)
            r = self.publish(root, self.step(2), 3, token=False)
            self.assertEqual(r.returncode, 1)
            self.assertIn("auth", r.stderr.lower())

            # A member killed without goodbye misses two versions, comes back
            # and catches up.
            self.assertEqual(members["ap-1"].stop(signal.SIGKILL), -signal.SIGKILL)
            for v in (3, 4):
                r = self.publish(root, self.step(v - 1), v)
                self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: "ap-1" not in self.served(root), 30, "the killed member dropped")
            members["ap-1"] = Agent(self.tmp, "ap-1", common + tok + ["--region", "ap"])
            agents.append(members["ap-1"])
            wait_for(lambda: self.served(root).get("ap-1") == 4 and all(
                x == 4 for x in self.served(root).values()), 60, "every member at version 4")
            for name, m in members.items():
                self.assertTrue(self.same_bytes(m.dir, self.step(3)), name)

            # Round trips, measured over the members' TLS connections (PING/PONG
            # to the root and on a probe connection to each parent).
            def measured():
                ms = self.status(root)["members"]
                return len(ms) == 3 and all(0 < m["rtt_to_root_s"] < 10 and 0 < m["rtt_to_parent_s"] < 10
                                            for m in ms)
            wait_for(measured, 30, "every member's round trips measured")

            # The human-readable status names every member, with round trips.
            r = subprocess.run([TERN, "status", "--board", root.admin], capture_output=True, text=True,
                               timeout=30, check=True)
            for name in members:
                self.assertIn(name, r.stdout)
            self.assertIn("rtt_p ms", r.stdout)
            # The agent's lock: its slow holds counted, with where the longest was taken.
            lock = self.status(root)["lock"]
            self.assertEqual(lock["slow_ms"], 100)
            self.assertGreaterEqual(lock["slow_holds"], 0)
            self.assertEqual(lock["longest_at"] == "", lock["slow_holds"] == 0, lock)
            metrics = subprocess.run(["curl", "-sf", "http://%s/metrics" % root.admin], capture_output=True,
                                     text=True, timeout=30)
            if metrics.returncode == 0:
                holds = re.search(r"^tern_agent_lock_slow_holds_total (\d+)$", metrics.stdout, re.M)
                self.assertIsNotNone(holds, metrics.stdout)
                self.assertGreaterEqual(int(holds.group(1)), lock["slow_holds"])
                self.assertIn('tern_agent_member_version{member="eu-1",region="eu"} 4', metrics.stdout)
                self.assertIn('tern_agent_member_rtt_to_root_seconds{member="eu-1",region="eu"}', metrics.stdout)
        finally:
            for a in reversed(agents):
                if a.proc.poll() is None:
                    self.assertEqual(a.stop(), 0, "%s did not exit cleanly" % a.log.name)

    def test_key_rotation_and_revocation(self):
        """Key set 1 (`tern keys rotate`, signed by A) moves a board from key
        A to key B and revokes A: a root restarted with B and the key set
        sends the chain to the members, which apply what B signs bit for bit;
        a root refuses to start signing with the revoked key; and what A
        signs after the revocation (a root still holding A) is refused by
        every member, naming A's key id, while they keep serving B's version."""
        tok = ["--join-token-file", os.path.join(self.tmp, "join.token")]
        key = make_signing_keys(os.path.join(self.tmp, "keys"), ("A", "B", "C"))
        ids = subprocess.run([TERN, "keys", "id", key("A.pub"), key("B.pem"), key("C.pub")], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
        id_a, id_b, id_c = ids[0], ids[2], ids[4]
        root_args = ["--root", "--region", "us", "--admin", "127.0.0.1:0",
                     "--admin-token-file", os.path.join(self.tmp, "admin.token")] + tok
        root = Agent(self.tmp, "kr-root", root_args + ["--signing-key", key("A.pem")])
        agents = [root]
        try:
            members = {}
            for name in ("kr-1", "kr-2"):
                members[name] = Agent(self.tmp, name, ["--join", root.address, "--trust-key", key("A.pub"),
                                                       "--region", "eu"] + tok)
                agents.append(members[name])
            wait_for(lambda: len(self.served(root)) == 2, 30, "two members joined")
            r = self.publish(root, self.step(0), 1)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: self.all_at(root, 1, 2), 60, "version 1 served")

            # Key set 1: B, revoking A, signed by A.
            ks1 = key("ks1.keyset")
            r = subprocess.run([TERN, "keys", "rotate", "--old-key", key("A.pem"), "--new-key", key("B.pub"),
                                "--revoke", key("A.pub"), "--expires-days", "30", "--out", ks1],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("revoked " + id_a, r.stdout)
            self.assertIn("signed by key id " + id_a, r.stdout)
            shown = subprocess.run([TERN, "keys", "show", ks1], capture_output=True, text=True, timeout=30,
                                   check=True).stdout
            self.assertIn("key set 1", shown)
            self.assertIn("key " + id_b + " not after", shown)
            # A key set signed by C (not in key set 0) does not chain: refused.
            forged = key("forged.keyset")
            subprocess.run([TERN, "keys", "rotate", "--old-key", key("C.pem"), "--new-key", key("B.pub"),
                            "--out", forged], capture_output=True, text=True, timeout=30, check=True)

            address = root.address
            self.assertEqual(root.stop(), 0)
            data = ["--listen", "127.0.0.1:0", "--data", root.dir, "--id", "kr-root", "--tls-cert",
                    os.path.join(self.tmp, "node.pem"), "--tls-key", os.path.join(self.tmp, "node.key"),
                    "--tls-ca", os.path.join(self.tmp, "ca.pem"), "--root", "--region", "us"]
            for flags, why in ((["--signing-key", key("A.pem"), "--key-set", ks1],
                                "signing key (key id " + id_a),
                               (["--signing-key", key("B.pem"), "--trust-key", key("A.pub"), "--key-set", forged],
                                "untrusted key id " + id_c)):
                r = subprocess.run([AGENT] + data + flags, capture_output=True, text=True, timeout=60)
                self.assertNotEqual(r.returncode, 0, r.stdout)
                self.assertIn(why, r.stderr)

            root = Agent(self.tmp, "kr-root", root_args + ["--signing-key", key("B.pem"), "--trust-key",
                                                           key("A.pub"), "--key-set", ks1], listen=address)
            agents.append(root)
            for m in members.values():
                wait_for(lambda: "key set 1 applied" in read(m.log.name), 60, m.name + " applied key set 1")
            wait_for(lambda: len(self.served(root)) == 2, 60, "the members joined again")
            r = self.publish(root, self.step(1), 2)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: self.all_at(root, 2, 2), 60, "version 2 (signed by B) served")
            for name, m in members.items():
                self.assertTrue(self.same_bytes(m.dir, self.step(1)), name)
            self.assertIn("carries a keyframe", read(root.log.name))

            # The root remembers the chain (DIR/key-sets): started again
            # with A, it refuses, naming A.
            self.assertEqual(root.stop(), 0)
            r = subprocess.run([AGENT] + data + ["--signing-key", key("A.pem"), "--trust-key", key("B.pub")],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn("signing key (key id " + id_a, r.stderr)
            # A root still holding A that never learned the chain (stolen, or
            # a copy of DIR from before the rotation) publishes version 3
            # signed by A: every member refuses it.
            os.unlink(os.path.join(root.dir, "key-sets"))
            root = Agent(self.tmp, "kr-root", root_args + ["--signing-key", key("A.pem"), "--trust-key",
                                                           key("B.pub")], listen=address)
            agents.append(root)
            wait_for(lambda: len(self.served(root)) == 2, 60, "the members joined the impostor")
            r = self.publish(root, self.step(2), 3)
            self.assertEqual(r.returncode, 0, r.stderr)
            for m in members.values():
                wait_for(lambda: "signed by revoked key id " + id_a in read(m.log.name), 30,
                         m.name + " refusing A's manifest")
            time.sleep(1)
            # Neither serves what A signed. Each drops its control connection
            # and joins again every 5 s (no valid HEAD beacon: stale), so the
            # root lists both only between those rejoins.
            wait_for(lambda: self.served(root) == {"kr-1": 2, "kr-2": 2}, 30,
                     "both members listed, each serving version 2")
            # A member restarted meanwhile keeps key set 1 (DIR/key-sets),
            # though this root never sends it.
            self.assertEqual(members["kr-2"].stop(), 0)
            members["kr-2"] = Agent(self.tmp, "kr-2", ["--join", address, "--trust-key", key("A.pub"),
                                                       "--region", "eu"] + tok)
            agents.append(members["kr-2"])
            wait_for(lambda: "signed by revoked key id " + id_a in read(members["kr-2"].log.name), 30,
                     "the restarted member refusing A's manifest")
            self.assertIn("key set 1 from", read(members["kr-2"].log.name))
            time.sleep(1)
            # Neither serves what A signed. Each drops its control connection
            # and joins again every 5 s (no valid HEAD beacon: stale), so the
            # root lists both only between those rejoins.
            wait_for(lambda: self.served(root) == {"kr-1": 2, "kr-2": 2}, 30,
                     "both members listed, each serving version 2")
            for name, m in members.items():
                self.assertTrue(self.same_bytes(m.dir, self.step(1)), name)
        finally:
            for a in reversed(agents):
                if a.proc.poll() is None:
                    self.assertEqual(a.stop(), 0, "%s did not exit cleanly" % a.log.name)

    def test_key_rotation_without_a_restart(self):
        """`tern keys push` hands a running root key set 1 and its new key:
        refused without the token, without the key the set lists, with a key
        set 0 does not trust, or signed by an untrusted key, each changing
        nothing; then accepted, and the members apply the chain at once and
        serve what the new key signs bit for bit. The root keeps both on disk
        (DIR/key-sets, DIR/signing-key.pem owner-only, DIR/key-set-0.pub), so
        the same command line after a restart signs with the new key; the
        same key set pushed again is refused."""
        tok = ["--join-token-file", os.path.join(self.tmp, "join.token")]
        admin_token = os.path.join(self.tmp, "admin.token")
        key = make_signing_keys(os.path.join(self.tmp, "keys-live"), ("B", "C"))
        root_args = ["--root", "--region", "us", "--admin", "127.0.0.1:0", "--admin-token-file", admin_token] + tok
        root = Agent(self.tmp, "kl-root", root_args)  # its key: DIR/signing-key.pem (A)
        agents = [root]
        a_pem = os.path.join(root.dir, "signing-key.pem")
        a_pub = os.path.join(root.dir, "public-key.pem")
        id_a, id_b = subprocess.run([TERN, "keys", "id", a_pub, key("B.pub")], capture_output=True, text=True,
                                    timeout=30, check=True).stdout.split()[0::2]

        def push(*extra, token=True):
            args = [TERN, "keys", "push", "--board", root.admin] + list(extra)
            if token:
                args += ["--token-file", admin_token]
            return subprocess.run(args, capture_output=True, text=True, timeout=60)

        try:
            members = {}
            for name in ("kl-1", "kl-2"):
                members[name] = Agent(self.tmp, name, ["--join", root.address, "--trust-key", a_pub,
                                                       "--region", "eu"] + tok)
                agents.append(members[name])
            wait_for(lambda: len(self.served(root)) == 2, 30, "two members joined")
            r = self.publish(root, self.step(0), 1)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: self.all_at(root, 1, 2), 60, "version 1 served")

            ks1, forged = key("ks1.keyset"), key("forged.keyset")
            subprocess.run([TERN, "keys", "rotate", "--old-key", a_pem, "--new-key", key("B.pub"), "--revoke",
                            a_pub, "--expires-days", "30", "--out", ks1], capture_output=True, text=True,
                           timeout=30, check=True)
            subprocess.run([TERN, "keys", "rotate", "--old-key", key("C.pem"), "--new-key", key("B.pub"),
                            "--out", forged], capture_output=True, text=True, timeout=30, check=True)
            refusals = (
                (push("--key-set", ks1, "--signing-key-file", key("B.pem"), token=False), "401"),
                (push("--key-set", ks1), "signing key (key id " + id_a),
                (push("--signing-key-file", key("B.pem")), "key id " + id_b),
                (push("--key-set", forged, "--signing-key-file", key("B.pem")), "refused"),
                (push("--signing-key-file", "relative/B.pem"), "absolute path"),
                (push("--key-set", key("B.pub")), "not a signed key set"),
            )
            for r, words in refusals:
                self.assertNotEqual(r.returncode, 0, r.stdout)
                self.assertIn(words, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(root.dir, "key-sets")))
            self.assertEqual(read(a_pem), read(a_pem))  # still A: the next publish is signed by A
            r = self.publish(root, self.step(1), 2)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: self.all_at(root, 2, 2), 60, "version 2 (A) served")

            r = push("--key-set", ks1, "--signing-key-file", key("B.pem"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("rotated", r.stdout)
            self.assertIn("keys rotated: key set 1, signing with key id " + id_b, read(root.log.name))
            for m in members.values():
                wait_for(lambda: "key set 1 applied" in read(m.log.name), 30, m.name + " applied key set 1")
            self.assertEqual(read(os.path.join(root.dir, "signing-key.pem")), read(key("B.pem")))
            self.assertEqual(os.stat(os.path.join(root.dir, "signing-key.pem")).st_mode & 0o777, 0o600)
            r = self.publish(root, self.step(2), 3)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: self.all_at(root, 3, 2), 60, "version 3 (B) served")
            for name, m in members.items():
                self.assertTrue(self.same_bytes(m.dir, self.step(2)), name)
            self.assertIn("carries a keyframe", read(root.log.name))
            r = push("--key-set", ks1)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn("key set 1 is applied already", r.stderr)

            # The same command line after a restart: key set 1 and B from DIR.
            address = root.address
            self.assertEqual(root.stop(), 0)
            root = Agent(self.tmp, "kl-root", root_args, listen=address)
            agents.append(root)
            wait_for(lambda: len(self.served(root)) == 2, 60, "the members joined again")
            r = self.publish(root, self.step(3), 4)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: self.all_at(root, 4, 2), 60, "version 4 (B) served")
            for name, m in members.items():
                self.assertTrue(self.same_bytes(m.dir, self.step(3)), name)
                self.assertNotIn("revoked key id", read(m.log.name), name)
        finally:
            for a in reversed(agents):
                if a.proc.poll() is None:
                    self.assertEqual(a.stop(), 0, "%s did not exit cleanly" % a.log.name)

    def test_demoted_relay_in_status(self):
        """A relay that stops sending (SIGSTOP) is reported stalled by its
        child and demoted by the root; `tern status` shows why, how often and
        when it may relay again (table and --json), and /metrics counts it."""
        tok = ["--join-token-file", os.path.join(self.tmp, "join.token")]
        root = Agent(self.tmp, "dm-root", ["--root", "--region", "us", "--admin", "127.0.0.1:0",
                                           "--admin-token-file", os.path.join(self.tmp, "admin.token"),
                                           "--root-fanout", "1", "--dead-after-ms", "60000",
                                           "--relay-probation-ms", "600000",
                                           # the board's stall time: members take the root's
                                           "--parent-stall-ms", "500"] + tok)
        agents = [root]
        try:
            common = ["--join", root.address, "--trust-key", os.path.join(root.dir, "public-key.pem"),
                      "--region", "eu"] + tok
            relay = Agent(self.tmp, "dm-relay", common)
            agents.append(relay)
            wait_for(lambda: len(self.served(root)) == 1, 30, "the relay joined")
            leaf = Agent(self.tmp, "dm-leaf", common)
            agents.append(leaf)
            wait_for(lambda: len(self.served(root)) == 2, 30, "the leaf joined")
            members = {m["id"]: m for m in self.status(root)["members"]}
            self.assertEqual(members["dm-leaf"]["parent"], "dm-relay")
            self.assertEqual(members["dm-relay"]["demotions"], 0)
            self.assertEqual(members["dm-relay"]["relay_again_in_s"], -1)
            os.killpg(relay.proc.pid, signal.SIGSTOP)
            try:
                r = self.publish(root, self.step(0), 1)
                self.assertEqual(r.returncode, 0, r.stderr)
                wait_for(lambda: {m["id"]: m for m in self.status(root)["members"]}["dm-relay"]["demoted"],
                         30, "the stalled relay demoted")
                wait_for(lambda: self.served(root)["dm-leaf"] == 1, 60, "the leaf served 1 around it")
                relay_row = {m["id"]: m for m in self.status(root)["members"]}["dm-relay"]
                self.assertEqual(relay_row["demoted_for"], "stalled")
                self.assertEqual(relay_row["demotions"], 1)
                self.assertGreater(relay_row["relay_again_in_s"], 500)
                self.assertLessEqual(relay_row["relay_again_in_s"], 600)
                table = subprocess.run([TERN, "status", "--board", root.admin], capture_output=True, text=True,
                                       timeout=30, check=True)
                row = [l for l in table.stdout.splitlines() if l.startswith("dm-relay! ")]
                self.assertEqual(len(row), 1, table.stdout)
                self.assertRegex(row[0], r"stalled x1, relays in (5\d\d|600) s$")
                leaf_row = [l for l in table.stdout.splitlines() if l.startswith("dm-leaf ")]
                self.assertEqual(len(leaf_row), 1, table.stdout)
                self.assertTrue(leaf_row[0].endswith(" -"), leaf_row[0])
                metrics = subprocess.run(["curl", "-sf", "http://%s/metrics" % root.admin], capture_output=True,
                                         text=True, timeout=30)
                if metrics.returncode == 0:
                    lines = metrics.stdout.splitlines()
                    self.assertIn('tern_agent_member_demotions_total{member="dm-relay",region="eu"} 1', lines)
                    self.assertIn('tern_agent_member_demotions_total{member="dm-leaf",region="eu"} 0', lines)
                    self.assertTrue(any(l.startswith(
                        'tern_agent_member_probation_seconds{member="dm-relay",region="eu"} 5') for l in lines),
                        metrics.stdout)
            finally:
                os.killpg(relay.proc.pid, signal.SIGCONT)
        finally:
            for a in reversed(agents):
                if a.proc.poll() is None:
                    self.assertEqual(a.stop(), 0, "%s did not exit cleanly" % a.log.name)

    def test_relay_only_member(self):
        """--relay-only: listed in --help; refused with flags only a serving
        member (or the root) has; as a process it relays to serving members
        (who serve every version bit for bit), keeps no DIR/current, and
        `tern status` shows it as a relay holding HEAD with lag 0."""
        h = subprocess.run([AGENT, "--help"], capture_output=True, text=True, timeout=30)
        self.assertIn("--relay-only", h.stdout)
        base = [AGENT, "--listen", "127.0.0.1:0", "--data", os.path.join(self.tmp, "ro-refused"),
                "--no-tls", "--relay-only"]
        for extra, other in ((["--join", "127.0.0.1:1", "--trust-key", "k", "--seed", "x",
                               "--seed-version", "1"], "--seed"),
                             (["--root"], "--root"),
                             (["--join", "127.0.0.1:1", "--trust-key", "k", "--no-relay"], "--no-relay"),
                             (["--join", "127.0.0.1:1", "--trust-key", "k", "--spare-grace-ms", "5"],
                              "--spare-grace-ms")):
            r = subprocess.run(base + extra, capture_output=True, text=True, timeout=30)
            self.assertNotEqual(r.returncode, 0, extra)
            self.assertIn("--relay-only", r.stderr + r.stdout, extra)
            self.assertIn(other, r.stderr + r.stdout, extra)
            self.assertLessEqual(len((r.stderr + r.stdout).strip().splitlines()), 3, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "ro-refused", "current")))

        root = self.token_root("ro-root")
        agents = [root]
        try:
            common = self.joining(root)
            relay = Agent(self.tmp, "ro-relay", common + ["--relay-only", "--admin", "127.0.0.1:0"])
            agents.append(relay)
            self.assertIn("relay-only member ro-relay listening", relay.startup_line)
            wait_for(lambda: len(self.served(root)) == 1, 30, "the relay-only member joined")
            serving = []
            for name in ("ro-s1", "ro-s2"):
                serving.append(Agent(self.tmp, name, common))
                agents.append(serving[-1])
                wait_for(lambda: len(self.served(root)) == len(serving) + 1, 30, name + " joined")
            for v in (1, 2):
                r = self.publish(root, self.step(v - 1), v)
                self.assertEqual(r.returncode, 0, r.stderr)
                wait_for(lambda: self.all_at(root, v, len(serving) + 1), 60, "version %d" % v)
                for m in serving:
                    self.assertTrue(self.same_bytes(m.dir, self.step(v - 1)), "%s at %d" % (m.log.name, v))
            self.assertFalse(os.path.lexists(os.path.join(relay.dir, "current")))
            self.assertFalse(os.path.exists(os.path.join(relay.dir, "views")))
            members = {m["id"]: m for m in self.status(root)["members"]}
            self.assertEqual(members["ro-relay"]["role"], "relay-only")
            self.assertEqual(members["ro-relay"]["parent"], "ro-root")
            self.assertEqual(members["ro-relay"]["lag"], 0)
            for m in ("ro-s1", "ro-s2"):
                self.assertEqual(members[m]["role"], "serving")
                self.assertEqual(members[m]["parent"], "ro-relay")
            own = subprocess.run([TERN, "status", "--board", relay.admin], capture_output=True, text=True,
                                 timeout=30, check=True)
            self.assertIn("relay-only ro-relay: HEAD 2, holding 2", own.stdout)
            table = subprocess.run([TERN, "status", "--board", root.admin], capture_output=True, text=True,
                                   timeout=30, check=True)
            row = [l for l in table.stdout.splitlines() if l.startswith("ro-relay ")]
            self.assertEqual(len(row), 1, table.stdout)
            self.assertEqual(row[0].split()[2:4], ["relay", "2"], row[0])
            for admin, line in ((root.admin, 'tern_agent_member_relay_only{member="ro-relay",region="eu"} 1'),
                                (root.admin, 'tern_agent_member_relay_only{member="ro-s1",region="eu"} 0'),
                                (relay.admin, "tern_agent_held_version 2"),
                                (relay.admin, "tern_agent_served_version 0")):
                metrics = subprocess.run(["curl", "-sf", "http://%s/metrics" % admin], capture_output=True,
                                         text=True, timeout=30)
                if metrics.returncode == 0:
                    self.assertIn(line, metrics.stdout.splitlines())
        finally:
            for a in reversed(agents):
                if a.proc.poll() is None:
                    self.assertEqual(a.stop(), 0, "%s did not exit cleanly" % a.log.name)

    def test_model_files_events_and_on_serve_hook(self):
        """A checkpoint's config and tokenizer reach the member's
        DIR/current with the version; GET /events names the served version;
        --on-serve runs with the event on stdin and in TERN_EVENT_*."""
        import shutil
        ckpt = os.path.join(self.tmp, "with-files")
        shutil.copytree(self.step(0), ckpt)
        files = {"config.json": '{"model_type": "llama"}\n', "tokenizer.json": "t" * 5000}
        for name, text in files.items():
            with open(os.path.join(ckpt, name), "w") as f:
                f.write(text)
        hook = os.path.join(self.tmp, "hook-out")
        tok = ["--join-token-file", os.path.join(self.tmp, "join.token")]
        root = Agent(self.tmp, "ev-root", ["--root", "--region", "us", "--admin", "127.0.0.1:0",
                                           "--admin-token-file", os.path.join(self.tmp, "admin.token")] + tok)
        agents = [root]
        try:
            member = Agent(self.tmp, "ev-m1", ["--join", root.address, "--trust-key",
                                               os.path.join(root.dir, "public-key.pem"), "--region", "us",
                                               "--admin", "127.0.0.1:0", "--on-serve",
                                               "cat > %s.json; echo $TERN_EVENT_VERSION > %s.env" % (hook, hook)]
                           + tok)
            agents.append(member)
            wait_for(lambda: len(self.served(root)) == 1, 30, "the member joined")
            r = self.publish(root, ckpt, 1)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: self.served(root).get("ev-m1") == 1, 60, "version 1")
            for name, text in files.items():
                self.assertEqual(read(os.path.join(member.dir, "current", name)), text, name)
            wait_for(lambda: os.path.exists(hook + ".env") and read(hook + ".env") == "1\n", 30, "the hook")
            event = json.loads(read(hook + ".json"))
            self.assertEqual(event["kind"], "version_served")
            self.assertEqual(event["version"], 1)
            self.assertEqual(event["slot_dir"], os.path.realpath(os.path.join(member.dir, "current")))
            polled = subprocess.run(["curl", "-sf", "http://%s/events?after=0" % member.admin],
                                    capture_output=True, text=True, timeout=30)
            if polled.returncode == 0:  # curl is installed (scripts/install-deps.sh)
                served = [e for e in json.loads(polled.stdout)["events"] if e["kind"] == "version_served"]
                self.assertEqual([e["version"] for e in served], [1])
                self.assertTrue(served[0]["all_tensors"])
        finally:
            for a in reversed(agents):
                if a.proc.poll() is None:
                    self.assertEqual(a.stop(), 0, "%s did not exit cleanly" % a.log.name)

    def test_intra_cluster_transport_and_the_fallback_for_a_missing_backend(self):
        """--transport-intra: a member whose backend works (plain tcp) gets its
        edge inside the cluster over it; one asking for verbs on a machine
        without an RDMA device says so in one log line and uses the main
        transport for every edge. Both serve the version bit for bit."""
        probe = subprocess.run([TERN, "transports"], capture_output=True, text=True, timeout=60)
        if re.search(r"^\s*verbs\s+(yes|available)", probe.stdout, re.M):
            self.skipTest("this machine has an RDMA device: verbs would not fall back")
        tok = ["--join-token-file", os.path.join(self.tmp, "join.token")]
        intra = ["--cluster", "c0", "--transport-intra", "tcp", "--listen-intra", "127.0.0.1:0"]
        root = Agent(self.tmp, "ic-root", ["--root", "--region", "us", "--admin", "127.0.0.1:0",
                                           "--admin-token-file", os.path.join(self.tmp, "admin.token")] + tok + intra)
        agents = [root]
        try:
            common = ["--join", root.address, "--trust-key", os.path.join(root.dir, "public-key.pem"),
                      "--region", "us"] + tok
            tcp = Agent(self.tmp, "ic-tcp", common + intra)
            agents.append(tcp)
            verbs = Agent(self.tmp, "ic-verbs", common + ["--cluster", "c0", "--transport-intra", "verbs",
                                                          "--listen-intra", "127.0.0.1:0"])
            agents.append(verbs)
            wait_for(lambda: len(self.served(root)) == 2, 30, "two members joined")
            self.assertIn("intra-cluster on 127.0.0.1:", tcp.startup_line)
            self.assertNotIn("intra-cluster on", verbs.startup_line)
            r = self.publish(root, self.step(0), 1)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: self.all_at(root, 1, 2), 60, "version 1 served")
            for m in (tcp, verbs):
                self.assertTrue(self.same_bytes(m.dir, self.step(0)), m.log.name)
            with open(verbs.log.name) as f:
                lines = [l for l in f if "intra-cluster transport verbs is not available here" in l]
            self.assertEqual(len(lines), 1, lines)
            self.assertIn("edges inside the cluster use", lines[0])
            with open(tcp.log.name) as f:
                self.assertNotIn("is not available here", f.read())
        finally:
            for a in reversed(agents):
                if a.proc.poll() is None:
                    self.assertEqual(a.stop(), 0, "%s did not exit cleanly" % a.log.name)

    def test_etcd_flags_are_secure_by_default(self):
        """--board-etcd off loopback over plain http, or unauthenticated, is
        refused at start (status 1) naming --etcd-insecure; misused --etcd-*
        flags are usage errors (status 2); the password is never echoed. No
        etcd is needed: every refusal comes before a connection."""
        secret = os.path.join(self.tmp, "etcd.password")
        with open(secret, "w") as f:
            f.write("etcd-secret-password\n")
        base = [AGENT, "--root", "--listen", "127.0.0.1:0", "--no-tls"]
        cases = (
            (["--board-etcd", "etcd://10.0.0.1:2379/tern/x"], 1, "plain http off loopback"),
            (["--board-etcd", "etcds://etcd.example:2379/tern/x"], 1, "does not authenticate"),
            (["--board-etcd", "etcd://10.0.0.1:2379/tern/x", "--etcd-user", "tern",
              "--etcd-password-file", secret], 1, "plain http off loopback"),
            (["--board-etcd", "etcd://127.0.0.1:1/tern/x", "--etcd-cacert", secret], 2, "etcds://"),
            (["--board-etcd", "etcds://127.0.0.1:1/tern/x", "--etcd-user", "tern"], 2,
             "--etcd-password-file"),
            (["--board-etcd", "etcds://127.0.0.1:1/tern/x", "--etcd-password-file", secret], 2,
             "--etcd-user"),
            (["--etcd-insecure"], 2, "--board-etcd"),
        )
        for i, (extra, status, words) in enumerate(cases):
            r = subprocess.run(base + ["--data", os.path.join(self.tmp, "etcd-refused-%d" % i)] + extra,
                               capture_output=True, text=True, timeout=30)
            out = r.stderr + r.stdout
            self.assertEqual(r.returncode, status, "%s: %s" % (extra, out))
            self.assertIn(words, out, extra)
            if status == 1:
                self.assertIn("--etcd-insecure", out, extra)
            self.assertNotIn("etcd-secret-password", out, extra)

    def test_malloc_arenas_flag_is_checked(self):
        """--malloc-arenas takes auto, glibc or 1..64; anything else is a
        usage error (status 2) naming the flag, before anything starts."""
        for bad in ("0", "65", "x", "4x", ""):
            r = subprocess.run([AGENT, "--root", "--listen", "127.0.0.1:0", "--no-tls", "--data",
                                os.path.join(self.tmp, "arenas-refused"), "--malloc-arenas", bad],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, "%r: %s" % (bad, r.stderr))
            self.assertIn("--malloc-arenas", r.stderr, bad)
            self.assertFalse(os.path.exists(os.path.join(self.tmp, "arenas-refused")), bad)

    def test_tcp_streams_sets_the_streams_a_member_dials(self):
        """--tcp-streams N: every connection the agent dials has N streams
        (counted as the member's established sockets to the root's port);
        0, the default, keeps 8. Out-of-range values are a usage error."""
        for bad in ("65", "x", "-1"):
            r = subprocess.run([AGENT, "--root", "--listen", "127.0.0.1:0", "--no-tls", "--data",
                                os.path.join(self.tmp, "streams-refused"), "--tcp-streams", bad],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, "%r: %s" % (bad, r.stderr))
            self.assertIn("--tcp-streams", r.stderr, bad)

        import shutil
        if not shutil.which("ss"):
            self.skipTest("no ss (scripts/install-deps.sh installs iproute2)")

        def sockets_to(port, pid):
            out = subprocess.run(["ss", "-Htnp", "state", "established", "( dport = :%d )" % port],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            if out.strip() and "pid=" not in out:
                self.skipTest("ss shows no process ids here")
            return sum(1 for line in out.splitlines() if "pid=%d," % pid in line)

        root = self.token_root("st-root")
        agents = [root]
        try:
            common = self.joining(root)
            one = Agent(self.tmp, "st-one", common + ["--tcp-streams", "1"])
            agents.append(one)
            default = Agent(self.tmp, "st-default", common)
            agents.append(default)
            wait_for(lambda: len(self.served(root)) == 2, 30, "both members joined")
            r = self.publish(root, self.step(0), 1)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: self.all_at(root, 1, 2), 60, "both members serve version 1")
            port = int(root.address.rsplit(":", 1)[1])
            # Control connection, relay link and round-trip probe: 3 sockets
            # with one stream; 8-24 with the default (a link not yet up
            # counts nothing).
            n_one, n_default = sockets_to(port, one.proc.pid), sockets_to(port, default.proc.pid)
            print("sockets to the root: --tcp-streams 1: %d, default: %d" % (n_one, n_default))
            self.assertGreaterEqual(n_one, 1)
            self.assertLessEqual(n_one, 3, "st-one has %d sockets to the root" % n_one)
            self.assertGreaterEqual(n_default, 8, "st-default has %d sockets to the root" % n_default)
        finally:
            for a in reversed(agents):
                a.stop()

    def test_admin_port_over_tls(self):
        """--admin-tls-cert/--admin-tls-key: the root prints an https://
        admin address; `tern publish` and `tern status` reach it with
        --admin-cacert and the token, and a member follows bit for bit; the
        system's trust store, a plain http:// address and a missing token are
        refused (status 1, saying why). Off loopback, a root with a token and
        no TLS refuses to start; TLS flags without --admin, or one without the
        other, are usage errors (status 2)."""
        tls = ["--admin-tls-cert", os.path.join(self.tmp, "node.pem"),
               "--admin-tls-key", os.path.join(self.tmp, "node.key")]
        admin_token = ["--admin-token-file", os.path.join(self.tmp, "admin.token")]
        tok = ["--join-token-file", os.path.join(self.tmp, "join.token")]
        cacert = ["--admin-cacert", os.path.join(self.tmp, "ca.pem")]
        root = Agent(self.tmp, "tls-root", ["--root", "--region", "us", "--admin", "127.0.0.1:0"] +
                     admin_token + tls + tok)
        agents = [root]
        try:
            self.assertTrue(root.admin and root.admin.startswith("https://127.0.0.1:"), root.startup_line)
            key = os.path.join(root.dir, "public-key.pem")
            member = Agent(self.tmp, "tls-m1", ["--join", root.address, "--trust-key", key, "--region", "us"] + tok)
            agents.append(member)

            def run(*args):
                return subprocess.run([TERN, *args], capture_output=True, text=True, timeout=120)
            publish = ["publish", "--board", root.admin, self.step(0), "--version", "1"]
            r = run(*publish, "--token-file", os.path.join(self.tmp, "admin.token"))
            self.assertEqual(r.returncode, 1, r.stderr)  # no CA: the system's store does not know ours
            self.assertIn("certificate was refused", r.stderr)
            r = run(*publish, *cacert)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("401", r.stderr)
            r = run("publish", "--board", root.admin.replace("https://", "http://"), self.step(0),
                    "--version", "1", "--token-file", os.path.join(self.tmp, "admin.token"))
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("speaks TLS", r.stderr)
            r = run(*publish, *cacert, "--token-file", os.path.join(self.tmp, "admin.token"))
            self.assertEqual(r.returncode, 0, r.stderr)
            r = run("status", "--board", root.admin, *cacert, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["head"], 1)

            def member_at_1():
                r = run("status", "--board", root.admin, *cacert, "--json")
                return r.returncode == 0 and [m["version"] for m in json.loads(r.stdout)["members"]] == [1]
            wait_for(member_at_1, 60, "the member at version 1")
            self.assertTrue(self.same_bytes(member.dir, self.step(0)))
        finally:
            for a in agents:
                a.stop()

        base = [AGENT, "--root", "--listen", "127.0.0.1:0", "--no-tls"]
        cases = (
            (["--admin", "0.0.0.0:0"] + admin_token, 1, "--admin-tls-cert"),
            (["--admin", "0.0.0.0:0"] + tls, 1, "no admin token"),
            (tls, 2, "--admin HOST:PORT"),
            (["--admin", "127.0.0.1:0", tls[0], tls[1]], 2, "--admin-tls-key"),
        )
        for i, (extra, status, words) in enumerate(cases):
            r = subprocess.run(base + ["--data", os.path.join(self.tmp, "admin-refused-%d" % i)] + extra,
                               capture_output=True, text=True, timeout=30)
            out = r.stderr + r.stdout
            self.assertEqual(r.returncode, status, "%s: %s" % (extra, out))
            self.assertIn(words, out, extra)
            if status == 1:
                self.assertIn("--admin-insecure", out, extra)

    def test_admin_port_requires_client_certificates(self):
        """--admin-tls-client-ca: the root's admin port asks for a client
        certificate that CA signed (mutual TLS) on top of the token. `tern
        status` and `tern publish` without --admin-cert, or with a
        certificate from another CA, are refused saying so (status 1);
        with the certificate and no token the publish is 401; with both it
        publishes. The flag without --admin-tls-cert is a usage error."""
        d = self.tmp
        if not os.path.exists(os.path.join(d, "rogue.pem")):
            Ca(d, "rogue-ca").issue("rogue", ["IP:127.0.0.1", "DNS:localhost"])
        tls = ["--admin-tls-cert", os.path.join(d, "node.pem"),
               "--admin-tls-key", os.path.join(d, "node.key")]
        client_ca = ["--admin-tls-client-ca", os.path.join(d, "ca.pem")]
        admin_token = ["--admin-token-file", os.path.join(d, "admin.token")]
        cacert = ["--admin-cacert", os.path.join(d, "ca.pem")]
        cert = ["--admin-cert", os.path.join(d, "node.pem"), "--admin-key", os.path.join(d, "node.key")]
        rogue = ["--admin-cert", os.path.join(d, "rogue.pem"), "--admin-key", os.path.join(d, "rogue.key")]
        token = ["--token-file", os.path.join(d, "admin.token")]
        root = Agent(d, "mtls-root", ["--root", "--region", "us", "--admin", "127.0.0.1:0"] +
                     admin_token + tls + client_ca)
        try:
            def run(*args):
                return subprocess.run([TERN, *args], capture_output=True, text=True, timeout=120)
            status = ["status", "--board", root.admin, *cacert, "--json"]
            publish = ["publish", "--board", root.admin, self.step(0), "--version", "1", *cacert]
            r = run(*status)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("requires a client certificate", r.stderr)
            r = run(*publish, *token)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("requires a client certificate", r.stderr)
            r = run(*publish, *token, *rogue)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("refused our client certificate", r.stderr)
            r = run(*publish, *cert)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("401", r.stderr)
            r = run(*publish, *cert[:2], *token)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("--admin-key", r.stderr)
            r = run(*status, *cert)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["head"], 0)
            r = run(*publish, *cert, *token)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = run(*status, *cert)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["head"], 1)
        finally:
            root.stop()
        r = subprocess.run([AGENT, "--root", "--listen", "127.0.0.1:0", "--no-tls", "--data",
                            os.path.join(d, "mtls-refused"), "--admin", "127.0.0.1:0"] + client_ca,
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr + r.stdout)
        self.assertIn("--admin-tls-client-ca", r.stderr + r.stdout)

    def test_supersede_recovers_from_a_wrong_version(self):
        """The recovery from a wrong version number (docs/agent/operations.md):
        1, 2, 3, then a forced 1000000 that every member serves; `tern
        publish --supersede --version 4` with the right weights: every member
        serves 4 in epoch 1 bit for bit (its /status says so), the refusals
        say why (not below HEAD, a number the log holds, 1000000 again), the
        next ordinary publish 5 works, and a member stopped during the
        supersede rejoins serving the withdrawn 1000000 and catches up."""
        trace = os.path.join(self.tmp, "supersede-trace")
        subprocess.run([TERN, "datagen", "--out", trace, "--params", "2M", "--steps", "6", "--lr", "1e-5",
                        "--threads", "1"], check=True, capture_output=True)
        step = lambda n: os.path.join(trace, "step-%06d" % n)
        tok = ["--join-token-file", os.path.join(self.tmp, "join.token")]
        root = Agent(self.tmp, "sup-root", ["--root", "--region", "us", "--admin", "127.0.0.1:0",
                                            "--max-version-jump", "100",
                                            "--admin-token-file", os.path.join(self.tmp, "admin.token")] + tok)
        agents = [root]

        def publish(path, version, *flags):
            return subprocess.run([TERN, "publish", "--board", root.admin, path, "--version", str(version),
                                   "--token-file", os.path.join(self.tmp, "admin.token"), *flags],
                                  capture_output=True, text=True, timeout=120)

        def member_status(m):
            r = subprocess.run([TERN, "status", "--board", m.admin, "--json"], capture_output=True,
                               text=True, timeout=30, check=True)
            return json.loads(r.stdout)

        def all_at(version, names):
            return lambda: (sorted(n for n, v in self.served(root).items() if v == version) == sorted(names))
        try:
            key = os.path.join(root.dir, "public-key.pem")
            common = ["--join", root.address, "--trust-key", key, "--admin", "127.0.0.1:0"] + tok
            members = {}
            for name, region in (("sup-1", "eu"), ("sup-2", "eu"), ("sup-3", "ap")):
                members[name] = Agent(self.tmp, name, common + ["--region", region])
                agents.append(members[name])
            wait_for(lambda: len(self.served(root)) == 3, 30, "three members joined")
            for v in (1, 2, 3):
                r = publish(step(v - 1), v)
                self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(all_at(3, members), 60, "every member at 3")
            # The typo: refused unless forced, then HEAD, served everywhere.
            r = publish(step(3), 1000000)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("beyond HEAD", r.stderr)
            r = publish(step(3), 1000000, "--force")
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(all_at(1000000, members), 60, "every member at 1000000")
            # One member is down during the supersede.
            self.assertEqual(members["sup-3"].stop(), 0)
            wait_for(lambda: "sup-3" not in self.served(root), 30, "the stopped member gone")
            # Refusals, each saying why, changing nothing.
            for version, words in ((1000001, "not below HEAD"), (2, "in the board's log already")):
                r = publish(step(3), version, "--supersede")
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(words, r.stderr)
            self.assertEqual(self.status(root)["head"], 1000000)
            # The supersede, with the right weights.
            r = publish(step(3), 4, "--supersede")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("supersede", r.stdout)
            st = self.status(root)
            self.assertEqual((st["head"], st["head_epoch"]), (4, 1))
            live = ("sup-1", "sup-2")
            wait_for(all_at(4, live), 60, "the live members at 4")
            for name in live:
                self.assertTrue(self.same_bytes(members[name].dir, step(3)), name)
                ms = member_status(members[name])
                self.assertEqual((ms["served_version"], ms["served_epoch"]), (4, 1), name)
                self.assertEqual((ms["head"], ms["head_epoch"]), (4, 1), name)
            # The withdrawn number stays taken.
            r = publish(step(4), 1000000, "--force")
            self.assertEqual(r.returncode, 1, r.stderr)
            # The next ordinary publish.
            r = publish(step(4), 5)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(all_at(5, live), 60, "the live members at 5")
            # The member stopped during the supersede rejoins at 1000000 and
            # catches up, across the epoch.
            members["sup-3"] = Agent(self.tmp, "sup-3", common + ["--region", "ap"])
            agents.append(members["sup-3"])
            wait_for(all_at(5, members), 60, "every member at 5")
            for name, m in members.items():
                self.assertTrue(self.same_bytes(m.dir, step(4)), name)
                self.assertEqual(member_status(m)["served_epoch"], 1, name)
            with open(members["sup-3"].log.name) as f:
                self.assertIn("serving version 1000000", f.read())
        finally:
            for a in reversed(agents):
                if a.proc.poll() is None:
                    self.assertEqual(a.stop(), 0, "%s did not exit cleanly" % a.log.name)

    def test_root_killed_with_a_standby_over_etcd(self):
        """Two roots over a real etcd: A leads, B waits. Two versions reach
        every member; A dies by SIGKILL (no resign: its lease must lapse).
        B leads within the lease plus a margin with HEAD 2, refuses 2
        again, and versions 3 (a keyframe on top of HEAD) and 4 (a patch)
        reach every member bit for bit through B."""
        etcd = EtcdServer.start(self.tmp)
        if etcd is None:
            self.skipTest("no etcd binary (install Debian's etcd-server or set TERN_ETCD)")
        lease_s = ETCD_LEASE_S
        agents = []
        publish3 = None
        passed = False
        try:
            key = os.path.join(self.tmp, "publisher-key.pem")  # one key for both roots
            openssl("genpkey", "-algorithm", "ed25519", "-out", key, cwd=self.tmp)
            root = ["--root", "--region", "us", "--admin", "127.0.0.1:0", "--board-etcd",
                    "etcd://%s/tern/cli" % etcd.endpoint, "--etcd-lease-s", str(lease_s), "--signing-key", key,
                    "--admin-token-file", os.path.join(self.tmp, "admin.token"),
                    "--join-token-file", os.path.join(self.tmp, "join.token")]
            a = Agent(self.tmp, "sb-a", root)
            agents.append(a)
            # B's address must be known before it listens (members are given
            # both), so it gets a port picked here.
            b_listen = "127.0.0.1:%d" % free_ports(1)[0]
            b = Agent(self.tmp, "sb-b", root, listen=b_listen, wait=False)
            agents.append(b)
            wait_for(lambda: "a standby waits here" in read(b.log.name), 30, "B campaigning")

            common = ["--join", a.address + "," + b_listen, "--trust-key", os.path.join(a.dir, "public-key.pem"),
                      "--join-token-file", os.path.join(self.tmp, "join.token")]
            members = {}
            for name, region in (("sb-eu-1", "eu"), ("sb-eu-2", "eu"), ("sb-ap-1", "ap")):
                members[name] = Agent(self.tmp, name, common + ["--region", region])
                agents.append(members[name])
            wait_for(lambda: len(self.served(a)) == 3, 30, "three members joined A")

            def all_serve(leader, v):
                served = self.served(leader)
                return len(served) == len(members) and all(x == v for x in served.values())

            def check_bytes(v):
                for name, m in members.items():
                    self.assertTrue(self.same_bytes(m.dir, self.step(v - 1)), "%s at version %d" % (name, v))

            for v in (1, 2):
                r = self.publish(a, self.step(v - 1), v)
                self.assertEqual(r.returncode, 0, r.stderr)
                wait_for(lambda: all_serve(a, v), 60, "version %d served through A" % v)
                check_bytes(v)
            self.assertIsNone(b.poll_started(), "B started (or exited) while A led")

            # A dies: no resign, its lease lapses. B leads within the lease
            # plus a margin (lease refresh every lease/3, B polls every 200
            # ms, then recovers the board from etcd; the margin is wide for
            # sanitized agents on a loaded machine).
            killed_at = time.time()
            self.assertEqual(a.kill(), -signal.SIGKILL)
            b.wait_started(30)
            took_over_s = b.started_at - killed_at
            self.assertLess(took_over_s, lease_s + 13, "B led %.1f s after A died" % took_over_s)

            # Nothing published was lost, and HEAD stays strictly increasing.
            r = subprocess.run([TERN, "status", "--board", b.admin], capture_output=True, text=True,
                               timeout=30, check=True)
            self.assertIn("root sb-b: HEAD 2,", r.stdout)
            r = self.publish(b, self.step(1), 2)
            self.assertEqual(r.returncode, 1)
            self.assertIn("not newer than HEAD 2", r.stderr)

            # Version 3 right away, in the background while the members still
            # find B: a keyframe on top of HEAD (B holds no view of 2).
            publish3 = subprocess.Popen([TERN, "publish", "--board", b.admin, self.step(2), "--version", "3",
                                         "--token-file", os.path.join(self.tmp, "admin.token")],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
            joined_s = served_s = None
            deadline = time.time() + 60
            while served_s is None:
                served = self.served(b)
                now = time.time() - killed_at
                if joined_s is None and len(served) == len(members):
                    joined_s = now
                if joined_s is not None and len(served) == len(members) and all(
                        x == 3 for x in served.values()):
                    served_s = now
                self.assertLess(time.time(), deadline, "timed out waiting for version 3 through B: %s" % served)
                time.sleep(0.05)
            _, err = publish3.communicate(timeout=60)
            self.assertEqual(publish3.returncode, 0, err)
            # Members try A and B in turn, at most ~1.1 s apart with standbys
            # (agent/daemon/dial_backoff.h), not after a backoff grown to 5 s.
            # That bound is agent.DialBackoff.*'s (no clock here: a loaded
            # machine running sanitized agents took 6.4 s); this one catches
            # members that stop dialling or back off for tens of seconds. The
            # figure is printed below.
            self.assertLess(joined_s - took_over_s, 15, "members found B %.1f s after it led" %
                            (joined_s - took_over_s))
            check_bytes(3)
            # A member whose parent was A redials it with backoff (0.1 s
            # doubling to 2 s: agent/daemon/dial_backoff.h) while no root
            # leads, not on every tick (it did: ~40 times in 2 s). The log
            # names the first failure of a run and sums the run up ("N dials
            # failed in T ms") when the root moves the member; per-tick
            # dials over this run's ~5-20 s would be hundreds.
            for name, m in members.items():
                log = read(m.log.name)
                runs = len(re.findall(r"parent \S+ of stripe 0 failed", log))
                dials = sum(int(n) for n in re.findall(r"of stripe 0: (\d+) dials failed in", log))
                print("%s: %d run(s) of failed dials to its parent, %d dials summed up" % (name, runs, dials))
                self.assertLessEqual(runs, 4, "%s: %d runs of failed parent dials" % (name, runs))
                self.assertLessEqual(dials, 40, "%s redialled its dead parent %d times" % (name, dials))
            r = self.publish(b, self.step(3), 4)  # and on with patches
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: all_serve(b, 4), 60, "version 4 served through B")
            check_bytes(4)
            self.assertEqual(self.status(b)["head"], 4)
            print("\nroot killed: B led after %.2f s, every member joined B after %.2f s and served "
                  "version 3 after %.2f s (lease %d s)" % (took_over_s, joined_s, served_s, lease_s),
                  file=sys.stderr)
            passed = True
        finally:
            codes = {}
            if publish3 is not None and publish3.poll() is None:
                os.killpg(publish3.pid, signal.SIGKILL)
                publish3.communicate(timeout=10)
            for x in reversed(agents):
                try:
                    codes[x.name] = x.stop()
                except AssertionError as e:
                    codes[x.name] = str(e)
            etcd.close()
        if passed:
            del codes["sb-a"]  # killed
            self.assertEqual(codes, {name: 0 for name in codes}, "agents that did not exit cleanly")

    def test_a_standby_learns_the_key_sets_from_the_board_in_etcd(self):
        """Roots A and B over a real etcd, B a standby given only its own key
        (B) and key set 0's (A): no --key-set. A publishes, then `tern keys
        push` moves the board to key set 1 (B, A revoked), which A keeps
        beside the board in etcd, and A publishes with B. A dies; B leads,
        learns key set 1 from the board, reads the history A signed with both
        keys, and what it publishes reaches the member bit for bit. A third
        root C with the revoked key A waits; when B stops, C takes the lead
        and refuses to sign with A, saying why, instead of publishing what
        every member would refuse."""
        etcd = EtcdServer.start(self.tmp)
        if etcd is None:
            self.skipTest("no etcd binary (install Debian's etcd-server or set TERN_ETCD)")
        key = make_signing_keys(os.path.join(self.tmp, "keys-etcd"), ("A", "B"))
        admin_token = os.path.join(self.tmp, "admin.token")
        roots = ["--root", "--region", "us", "--admin", "127.0.0.1:0", "--board-etcd",
                 "etcd://%s/tern/keys" % etcd.endpoint, "--etcd-lease-s", str(ETCD_LEASE_S), "--trust-key", key("A.pub"),
                 "--admin-token-file", admin_token, "--join-token-file", os.path.join(self.tmp, "join.token")]
        agents = []
        try:
            a = Agent(self.tmp, "ke-a", roots + ["--signing-key", key("A.pem")])
            agents.append(a)
            b_listen, c_listen = ("127.0.0.1:%d" % p for p in free_ports(2))
            b = Agent(self.tmp, "ke-b", roots + ["--signing-key", key("B.pem")], listen=b_listen, wait=False)
            agents.append(b)
            wait_for(lambda: "a standby waits here" in read(b.log.name), 30, "B campaigning")
            m = Agent(self.tmp, "ke-m", ["--join", ",".join((a.address, b_listen, c_listen)), "--trust-key",
                                         key("A.pub"), "--region", "eu", "--join-token-file",
                                         os.path.join(self.tmp, "join.token")])
            agents.append(m)
            wait_for(lambda: len(self.served(a)) == 1, 30, "the member joined A")

            def publish_served(root, v):
                r = self.publish(root, self.step(v - 1), v)
                self.assertEqual(r.returncode, 0, r.stderr)
                wait_for(lambda: list(self.served(root).values()) == [v], 60, "version %d served" % v)
                self.assertTrue(self.same_bytes(m.dir, self.step(v - 1)), "version %d" % v)

            publish_served(a, 1)
            ks1 = key("ks1.keyset")
            subprocess.run([TERN, "keys", "rotate", "--old-key", key("A.pem"), "--new-key", key("B.pub"), "--revoke",
                            key("A.pub"), "--out", ks1], capture_output=True, text=True, timeout=30, check=True)
            r = subprocess.run([TERN, "keys", "push", "--board", a.admin, "--key-set", ks1, "--signing-key-file",
                                key("B.pem"), "--token-file", admin_token], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            wait_for(lambda: "key set 1 applied" in read(m.log.name), 30, "the member applied key set 1")
            publish_served(a, 2)  # signed by B

            self.assertEqual(a.kill(), -signal.SIGKILL)
            b.wait_started(30)
            self.assertIn("key set 1 from the board in etcd", read(b.log.name))
            wait_for(lambda: len(self.served(b)) == 1, 30, "the member joined B")
            publish_served(b, 3)
            self.assertNotIn("revoked key id", read(m.log.name))

            c = Agent(self.tmp, "ke-c", roots + ["--signing-key", key("A.pem")], listen=c_listen, wait=False)
            agents.append(c)
            wait_for(lambda: "a standby waits here" in read(c.log.name), 30, "C campaigning")
            self.assertEqual(b.stop(), 0)
            c.proc.wait(timeout=30)
            self.assertNotEqual(c.proc.returncode, 0)
            self.assertIn("is not an active, unexpired key of key set 1", read(c.log.name))
            self.assertTrue(self.same_bytes(m.dir, self.step(2)), "the member still serves version 3")
        finally:
            for x in reversed(agents):
                if x.proc.poll() is None:
                    x.kill()
            etcd.close()

    def test_a_root_that_leads_again_publishes_on_top_of_head(self):
        """A leads (1, 2), is killed, B leads (3, 4), A comes back as the
        standby with its old DIR (its view is version 2's), B is killed: A
        leads again and must publish 5 on top of HEAD 4. It diffed from its
        own view of 2 and every publish was refused ("prev_digest ... is not
        D(4)"), for good: found by the soak (docs/soak.md)."""
        etcd = EtcdServer.start(self.tmp)
        if etcd is None:
            self.skipTest("no etcd binary (install Debian's etcd-server or set TERN_ETCD)")
        agents = []
        try:
            key = os.path.join(self.tmp, "relead-key.pem")
            openssl("genpkey", "-algorithm", "ed25519", "-out", key, cwd=self.tmp)
            root = ["--root", "--region", "us", "--admin", "127.0.0.1:0", "--board-etcd",
                    "etcd://%s/tern/relead" % etcd.endpoint, "--etcd-lease-s", str(ETCD_LEASE_S), "--signing-key", key,
                    "--admin-token-file", os.path.join(self.tmp, "admin.token"),
                    "--join-token-file", os.path.join(self.tmp, "join.token")]
            a_listen, b_listen = ("127.0.0.1:%d" % p for p in free_ports(2))
            a = Agent(self.tmp, "rl-a", root, listen=a_listen)
            b = Agent(self.tmp, "rl-b", root, listen=b_listen, wait=False)
            agents += [a, b]
            common = ["--join", a_listen + "," + b_listen, "--trust-key", os.path.join(a.dir, "public-key.pem"),
                      "--join-token-file", os.path.join(self.tmp, "join.token")]
            members = {}
            for name, region in (("rl-eu-1", "eu"), ("rl-ap-1", "ap")):
                members[name] = Agent(self.tmp, name, common + ["--region", region])
                agents.append(members[name])

            def publish_everywhere(leader, v):
                r = self.publish(leader, self.step(v % 4), v)
                self.assertEqual(r.returncode, 0, "version %d through %s: %s" % (v, leader.name, r.stderr))
                wait_for(lambda: (lambda s: len(s) == len(members) and all(x == v for x in s.values()))(
                    self.served(leader)), 60, "version %d served through %s" % (v, leader.name))
                for name, m in members.items():
                    self.assertTrue(self.same_bytes(m.dir, self.step(v % 4)), "%s at version %d" % (name, v))

            wait_for(lambda: len(self.served(a)) == len(members), 30, "members joined A")
            for v in (1, 2):
                publish_everywhere(a, v)
            a.kill()
            b.wait_started(30)
            for v in (3, 4):
                publish_everywhere(b, v)
            # A again, as the standby, with the DIR it served version 2 from.
            agents.remove(a)
            a = Agent(self.tmp, "rl-a", root, listen=a_listen, wait=False)
            agents.append(a)
            wait_for(lambda: "a standby waits here" in read(a.log.name), 30, "A campaigning again")
            b.kill()
            a.wait_started(30)
            publish_everywhere(a, 5)  # a keyframe on top of HEAD 4
            publish_everywhere(a, 6)  # and a patch from it
        finally:
            for x in reversed(agents):
                x.kill()
            etcd.close()



if __name__ == "__main__":
    TERN, AGENT = sys.argv[1], sys.argv[2]
    # Further arguments name tests to run (AgentCli.test_...), as unittest takes them.
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)
