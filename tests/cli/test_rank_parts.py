#!/usr/bin/env python3
"""Trainer ranks in other processes (docs/agent/board.md §4b): a root and a
member (`tern-agent` processes on 127.0.0.1) and two rank processes that
publish the rows they own through the root's POST /publish/rank-part
(tern.Publisher over the C API).

Usage: test_rank_parts.py PATH_TO_TERN_AGENT (with the tern module on
PYTHONPATH and NumPy). Checked: versions from both ranks reach the member
bit for bit; a rank that never sends fails the version naming it and
nothing is published, and the rank that did send publishes it again with
the other afterwards (its previous view stayed); a garbage or truncated
body gets 400 saying why, no token gets 401, and neither changes HEAD.
Over an https:// admin port a rank with the CA publishes, one without it
is refused naming the certificate; over one that requires client
certificates, a rank without one is refused saying so and one with a
certificate the CA signed publishes.

Run as `test_rank_parts.py rank R WORLD BOARD TOKEN_FILE [CA_FILE [CERT KEY]]` it is
one rank: it reads "publish V" lines on stdin and answers one JSON line
each.
"""
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

from pki import node_pki

HERE = os.path.dirname(os.path.abspath(__file__))
AGENT = None

# The view: names, dtypes, shapes; rank r owns rows [r*h, (r+1)*h) of the
# two matrices, rank 0 the bias.
LAYOUT = {"a.weight": ("BF16", [64, 32]), "b.weight": ("F32", [32, 16]), "c.bias": ("F32", [16])}


def rows_of(rank, world):
    out = {}
    for name in ("a.weight", "b.weight"):
        h = LAYOUT[name][1][0] // world
        out[name] = (rank * h, (rank + 1) * h)
    if rank == 0:
        out["c.bias"] = (0, 16)
    return out


def weights(version):
    """The whole view of `version` as raw bytes per tensor: random at 1,
    then ~2% of the elements changed per version."""
    import numpy as np
    rng = np.random.default_rng(7)
    w = {"a.weight": rng.integers(0, 1 << 16, size=(64, 32), dtype=np.uint16),
         "b.weight": rng.standard_normal((32, 16)).astype(np.float32),
         "c.bias": rng.standard_normal(16).astype(np.float32)}
    for v in range(2, version + 1):
        step = np.random.default_rng(v)
        for name, t in w.items():
            flat = t.reshape(-1)
            idx = step.choice(flat.size, max(1, flat.size // 50), replace=False)
            if flat.dtype == np.uint16:
                flat[idx] ^= 1
            else:
                flat[idx] += np.float32(0.25)
    return w


def run_rank(rank, world, board, token_file, ca_file=None, cert_file=None, key_file=None):
    import tern
    with open(token_file) as f:
        token = f.read().strip()

    def pem(path):
        if not path:
            return None
        with open(path) as f:
            return f.read()
    ca_pem, cert_pem, key_pem = pem(ca_file), pem(cert_file), pem(key_file)
    rows = rows_of(rank, world)
    pub = tern.Publisher(rank=rank, world_size=world, board=board, token=token, layout=LAYOUT,
                         shards=rows, gather_timeout_s=10, timeout_s=60, segment_elements=256,
                         ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem)
    print(json.dumps({"ready": True}), flush=True)  # imports done: the parts leave together
    for line in sys.stdin:
        cmd, v = line.split()
        assert cmd == "publish"
        w = weights(int(v))
        mine = {n: w[n][a:b] for n, (a, b) in rows.items()}
        t0 = time.monotonic()
        try:
            size = pub.publish(int(v), mine)
            out = {"ok": True, "part_bytes": size, "seconds": time.monotonic() - t0}
        except tern.Error as e:
            out = {"ok": False, "code": e.code_name, "error": str(e)}
        print(json.dumps(out), flush=True)


class Proc:
    def __init__(self, args, log, stdin=False):
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True,
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     start_new_session=True)

    def line(self, seconds):
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], seconds)[0]:
            raise AssertionError("no answer within %d s" % seconds)
        return self.proc.stdout.readline()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def safetensors_bytes(directory):
    """name -> raw bytes of every tensor in a checkpoint directory."""
    import struct
    out = {}
    for n in sorted(os.listdir(directory)):
        if not n.endswith(".safetensors"):
            continue
        with open(os.path.join(directory, n), "rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(size))
            data = f.read()
        for name, t in header.items():
            if name != "__metadata__":
                a, b = t["data_offsets"]
                out[name] = data[a:b]
    return out


class RankParts(unittest.TestCase):
    def setUp(self):
        self.tmp_ctx = tempfile.TemporaryDirectory(prefix="tern-rank-parts-")
        self.tmp = self.tmp_ctx.name
        self.token_file = os.path.join(self.tmp, "admin.token")
        with open(self.token_file, "w") as f:
            f.write("rank-secret\n")
        self.procs = []

    def tearDown(self):
        for p in reversed(self.procs):
            p.stop()
        self.tmp_ctx.cleanup()

    def agent(self, name, args):
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        p = Proc([AGENT, "--listen", "127.0.0.1:0", "--data", os.path.join(self.tmp, name), "--id", name,
                  "--heartbeat-ms", "100", "--no-tls"] + args, log)
        self.procs.append(p)
        line = p.line(60)
        addr = line.split("listening on ")[1].split(",")[0].strip()
        admin = None
        for scheme in ("https://", "http://"):
            if "admin " + scheme in line:
                admin = line.split("admin " + scheme)[1].split()[0].strip(",")
                admin = admin if scheme == "http://" else scheme + admin
                break
        return p, addr, admin

    def status(self, admin):
        with urllib.request.urlopen("http://%s/status" % admin, timeout=10) as r:
            return json.loads(r.read())

    def post(self, admin, body, token="rank-secret"):
        req = urllib.request.Request("http://%s/publish/rank-part" % admin, data=body, method="POST")
        if token:
            req.add_header("Authorization", "Bearer " + token)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def rank(self, r, world, board, ca_file=None, cert=None):
        log = open(os.path.join(self.tmp, "rank%d-%s%s.log" % (r, "tls" if ca_file else "plain",
                                                              "-cert" if cert else "")), "w")
        p = Proc([sys.executable, os.path.abspath(__file__), "rank", str(r), str(world), board,
                  self.token_file] + ([ca_file] if ca_file else []) + (list(cert) if cert else []),
                 log, stdin=True)
        self.procs.append(p)
        # Ready before the test asks for a part: a rank still importing
        # numpy and tern on a loaded machine made the other's part wait
        # past the gather timeout.
        self.assertEqual(json.loads(p.line(60)), {"ready": True})
        return p

    def publish(self, procs, version):
        for p in procs:
            p.proc.stdin.write("publish %d\n" % version)
            p.proc.stdin.flush()
        return [json.loads(p.line(60)) for p in procs]

    def wait_served(self, admin, version, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            members = self.status(admin).get("members", [])
            if members and all(m["version"] >= version for m in members):
                return
            time.sleep(0.1)
        raise AssertionError("version %d not served within %d s" % (version, seconds))

    def test_ranks_in_processes(self):
        _, root_addr, admin = self.agent("root", ["--root", "--admin", "127.0.0.1:0",
                                                  "--admin-token-file", self.token_file])
        key = os.path.join(self.tmp, "root", "public-key.pem")
        self.agent("member", ["--join", root_addr, "--trust-key", key])
        deadline = time.time() + 30
        while not self.status(admin).get("members"):
            self.assertLess(time.time(), deadline, "the member did not join")
            time.sleep(0.1)
        ranks = [self.rank(r, 2, "http://" + admin) for r in range(2)]

        def publish(version, which=(0, 1)):
            return self.publish([ranks[r] for r in which], version)

        for v in (1, 2):
            answers = publish(v)
            self.assertTrue(all(a["ok"] for a in answers), answers)
            self.wait_served(admin, v)
            served = safetensors_bytes(os.path.join(self.tmp, "member", "current"))
            want = {n: t.tobytes() for n, t in weights(v).items()}
            self.assertEqual(served, want, "version %d bit for bit" % v)

        # Rank 1 never sends version 3: rank 0 is told which rank failed it.
        (answer,) = publish(3, which=(0,))
        self.assertFalse(answer["ok"])
        self.assertIn("no part from rank(s) 1", answer["error"])
        self.assertIn("nothing published", answer["error"])
        self.assertEqual(self.status(admin)["head"], 2)

        # Bad bodies: 400 saying why, nothing taken; no token: 401.
        code, text = self.post(admin, b"garbage")
        self.assertEqual(code, 400, text)
        self.assertIn("rank part", text)
        with open(os.path.join(HERE, "..", "fuzz", "corpus", "rank_part", "format2_records"), "rb") as f:
            whole = f.read()
        code, text = self.post(admin, whole[:len(whole) // 2])
        self.assertEqual(code, 400, text)
        self.assertIn("truncated", text)
        code, text = self.post(admin, whole, token=None)
        self.assertEqual(code, 401, text)
        self.assertEqual(self.status(admin)["head"], 2)

        # Both ranks again: rank 0's previous view stayed version 2's.
        answers = publish(3)
        self.assertTrue(all(a["ok"] for a in answers), answers)
        self.wait_served(admin, 3)
        served = safetensors_bytes(os.path.join(self.tmp, "member", "current"))
        self.assertEqual(served, {n: t.tobytes() for n, t in weights(3).items()})

    def test_over_tls(self):
        node_pki(self.tmp)
        _, root_addr, admin = self.agent("root", [
            "--root", "--admin", "127.0.0.1:0", "--admin-token-file", self.token_file,
            "--admin-tls-cert", os.path.join(self.tmp, "node.pem"),
            "--admin-tls-key", os.path.join(self.tmp, "node.key")])
        self.assertTrue(admin and admin.startswith("https://127.0.0.1:"), admin)
        # Without the CA (the system's trust store) the certificate is refused.
        (answer,) = self.publish([self.rank(0, 1, admin)], 1)
        self.assertFalse(answer["ok"])
        self.assertEqual(answer["code"], "authentication", answer)
        self.assertIn("certificate", answer["error"])
        (answer,) = self.publish([self.rank(0, 1, admin, os.path.join(self.tmp, "ca.pem"))], 1)
        self.assertTrue(answer["ok"], answer)
        self.assertGreater(answer["part_bytes"], 0)

    def test_over_mutual_tls(self):
        """--admin-tls-client-ca: a rank without a client certificate is
        refused saying so; with one the CA signed (tern.Publisher's
        cert_pem/key_pem) it publishes."""
        node_pki(self.tmp)
        ca = os.path.join(self.tmp, "ca.pem")
        _, root_addr, admin = self.agent("root", [
            "--root", "--admin", "127.0.0.1:0", "--admin-token-file", self.token_file,
            "--admin-tls-cert", os.path.join(self.tmp, "node.pem"),
            "--admin-tls-key", os.path.join(self.tmp, "node.key"), "--admin-tls-client-ca", ca])
        (answer,) = self.publish([self.rank(0, 1, admin, ca)], 1)
        self.assertFalse(answer["ok"])
        self.assertEqual(answer["code"], "authentication", answer)
        self.assertIn("requires a client certificate", answer["error"])
        cert = (os.path.join(self.tmp, "node.pem"), os.path.join(self.tmp, "node.key"))
        (answer,) = self.publish([self.rank(0, 1, admin, ca, cert)], 1)
        self.assertTrue(answer["ok"], answer)
        self.assertGreater(answer["part_bytes"], 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        run_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], *sys.argv[6:9])
        sys.exit(0)
    AGENT = sys.argv[1]
    unittest.main(argv=sys.argv[:1] + sys.argv[2:], verbosity=2)
