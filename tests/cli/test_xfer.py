#!/usr/bin/env python3
"""End-to-end tests of `tern xfer serve` / `tern xfer get` as processes.

Usage: test_xfer.py PATH_TO_TERN. Everything runs on 127.0.0.1 (UCX is held
to the loopback device through its environment). Checks: a plain and a
mutual-TLS copy land bit-exact with a parseable summary line; a client
without the server's CA is refused and leaves no file; names escaping the
served root are refused and leave no partial file; serving / works; an
existing LOCAL is replaced only with --force;
--transport ucx copies between two processes;
--transport verbs explains itself where there is no RDMA device; RDMA
transports refuse to run without an explicit --no-tls; serve stops cleanly
on SIGTERM.

TLS identity: a server whose certificate (from the same CA) names another
host, or is the client's own, is refused; pins and a server's allow-list of
clients hold.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

from pki import Ca

TERN = None
LOOPBACK_UCX = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}


def make_pki(d):
    """A CA, a server certificate for 127.0.0.1, a client certificate, another
    host's server certificate (all P-256, one CA, any use), and a rogue CA."""
    ca = Ca(d)
    Ca(d, "rogue")
    for who, names in (("server", ["IP:127.0.0.1", "DNS:localhost"]), ("client", ["DNS:client.tern.test"]),
                       ("wrong", ["DNS:wrong.tern.test", "IP:10.9.8.7"])):
        ca.issue(who, names, eku=None)


def fingerprint(pem):
    """sha256:HEX of a certificate, as --tls-pin takes it."""
    out = subprocess.run(["openssl", "x509", "-in", pem, "-noout", "-fingerprint", "-sha256"],
                         check=True, capture_output=True, text=True).stdout
    return "sha256:" + out.strip().split("=", 1)[1]


class Server:
    """`tern xfer serve` on a free port; stops on SIGTERM at exit."""

    def __init__(self, root, *flags, env=None, listen="127.0.0.1:0"):
        self.proc = subprocess.Popen([TERN, "xfer", "serve", "--listen", listen, *flags, root],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        line = self.proc.stdout.readline()
        m = re.search(r"on (\S+) \(", line)
        if not m:
            self.proc.kill()
            raise AssertionError("serve printed no address: %r %s" % (line, self.proc.stderr.read()))
        self.address = m.group(1)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            # Generous for a loaded CI machine; a server that ignores SIGTERM
            # is killed, not left running behind a failed test.
            out, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError("serve did not stop within 60 s of SIGTERM: %s" % err)
        return self.proc.returncode, err


def get(address, name, out, *flags, env=None):
    return subprocess.run([TERN, "xfer", "get", address, name, "-o", out, "--quiet", *flags],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def summary(stdout):
    line = [l for l in stdout.splitlines() if l.startswith("xfer: bytes=")]
    assert line, stdout
    return dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line[-1]))


class XferTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="tern-xfer-cli-")
        cls.dir = cls.tmp.name
        cls.root = os.path.join(cls.dir, "root")
        os.makedirs(os.path.join(cls.root, "sub"))
        cls.data = os.urandom(9 * 1024 * 1024 + 12345)  # a partial last chunk
        with open(os.path.join(cls.root, "sub", "w.bin"), "wb") as f:
            f.write(cls.data)
        with open(os.path.join(cls.dir, "secret"), "wb") as f:
            f.write(b"outside the root")
        make_pki(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def pki(self, who, ca="ca"):
        d = self.dir
        return ["--tls-cert", os.path.join(d, who + ".pem"), "--tls-key", os.path.join(d, who + ".key"),
                "--tls-ca", os.path.join(d, ca + ".pem")]

    def out(self, name):
        path = os.path.join(self.dir, name)
        for p in (path, path + ".tern-part", path + ".tern-part.state"):
            if os.path.exists(p):
                os.remove(p)
        return path

    def assert_copy(self, proc, path):
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), self.data)
        s = summary(proc.stdout)
        self.assertEqual(int(s["bytes"]), len(self.data))
        self.assertRegex(s["xxh3"], r"^[0-9a-f]{16}$")
        self.assertFalse(os.path.exists(path + ".tern-part"))
        return s

    def test_plain_copy_with_chunks_and_streams(self):
        srv = Server(self.root, "--no-tls")
        try:
            path = self.out("plain.bin")
            s = self.assert_copy(get(srv.address, "sub/w.bin", path, "--no-tls", "--streams", "3",
                                     "--chunk", "1M"), path)
            self.assertEqual(s["streams"], "3")
            self.assertIn("3 streams", s["link"])
        finally:
            rc, err = srv.stop()
        self.assertEqual(rc, 0, err)
        self.assertIn("stopping on signal", err)

    def test_an_existing_local_file_is_replaced_only_with_force(self):
        # Like diff, apply, squash, cast and datagen (docs/cli.md); get used
        # to overwrite LOCAL silently.
        srv = Server(self.root, "--no-tls")
        try:
            path = self.out("existing.bin")
            with open(path, "wb") as f:
                f.write(b"keep me")
            proc = get(srv.address, "sub/w.bin", path, "--no-tls")
            self.assertEqual(proc.returncode, 1, proc.stderr)
            self.assertEqual(proc.stderr.strip().splitlines(),
                             [l for l in proc.stderr.strip().splitlines() if "exists" in l])
            self.assertIn("use --force", proc.stderr)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), b"keep me")
            self.assertFalse(os.path.exists(path + ".tern-part"))
            self.assert_copy(get(srv.address, "sub/w.bin", path, "--no-tls", "--force"), path)
        finally:
            srv.stop()

    def test_an_access_token_is_required_when_the_server_has_one(self):
        token = os.path.join(self.dir, "xfer-token")
        with open(token, "w") as f:
            f.write("s3cret\n")  # the trailing newline is not part of it
        srv = Server(self.root, "--no-tls", "--token-file", token)
        try:
            path = self.out("token.bin")
            for env in ({}, {"TERN_XFER_TOKEN": "s3creT"}):
                proc = get(srv.address, "sub/w.bin", path, "--no-tls", env=env)
                self.assertEqual(proc.returncode, 1, proc.stderr)
                self.assertIn("access token", proc.stderr)
                self.assertFalse(os.path.exists(path + ".tern-part"))
            self.assert_copy(get(srv.address, "sub/w.bin", path, "--no-tls",
                                 env={"TERN_XFER_TOKEN": "s3cret"}), path)
            path = self.out("token-file.bin")
            self.assert_copy(get(srv.address, "sub/w.bin", path, "--no-tls", "--token-file", token), path)
        finally:
            srv.stop()

    def test_mutual_tls_copy_and_a_refused_client(self):
        srv = Server(self.root, *self.pki("server"))
        try:
            path = self.out("tls.bin")
            s = self.assert_copy(get(srv.address, "sub/w.bin", path, *self.pki("client")), path)
            self.assertIn("tls1.3", s["link"])
            # A client that trusts another CA refuses the server: no file.
            bad = self.out("rogue.bin")
            proc = get(srv.address, "sub/w.bin", bad, *self.pki("client", ca="rogue"), "--retries", "0")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("tern xfer get:", proc.stderr)
            self.assertFalse(os.path.exists(bad))
            # Plain TCP against the TLS server fails too, without a hang.
            proc = get(srv.address, "sub/w.bin", bad, "--no-tls", "--retries", "0")
            self.assertNotEqual(proc.returncode, 0)
            self.assertFalse(os.path.exists(bad))
        finally:
            srv.stop()

    def test_get_checks_the_servers_identity(self):
        """The CA signed every certificate here: get must still refuse a server
        whose certificate names another host, or is the client's own."""
        for cert, says in (("wrong", "does not name 127.0.0.1 (it names DNS:wrong.tern.test, IP:10.9.8.7)"),
                           ("client", "does not name 127.0.0.1 (it names DNS:client.tern.test)")):
            with self.subTest(cert):
                srv = Server(self.root, *self.pki(cert))
                try:
                    bad = self.out("impostor.bin")
                    proc = get(srv.address, "sub/w.bin", bad, *self.pki("client"), "--retries", "0")
                    self.assertNotEqual(proc.returncode, 0)
                    self.assertIn("tern xfer get:", proc.stderr)
                    self.assertIn(says, proc.stderr)
                    self.assertIn("--tls-server-name", proc.stderr)
                    self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
                    self.assertFalse(os.path.exists(bad))
                    if cert == "wrong":  # the name to expect can be given
                        path = self.out("named.bin")
                        self.assert_copy(get(srv.address, "sub/w.bin", path, *self.pki("client"),
                                             "--tls-server-name", "wrong.tern.test"), path)
                finally:
                    srv.stop()

    def test_pins_and_allowed_clients(self):
        srv = Server(self.root, *self.pki("server"), "--tls-allow-client", "client.tern.test")
        try:
            path = self.out("pinned.bin")
            self.assert_copy(get(srv.address, "sub/w.bin", path, *self.pki("client"), "--tls-pin",
                                 fingerprint(os.path.join(self.dir, "wrong.pem")) + "," +
                                 fingerprint(os.path.join(self.dir, "server.pem"))), path)
            bad = self.out("unpinned.bin")
            proc = get(srv.address, "sub/w.bin", bad, *self.pki("client"), "--retries", "0",
                       "--tls-pin", fingerprint(os.path.join(self.dir, "wrong.pem")))
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("which is not pinned", proc.stderr)
            self.assertFalse(os.path.exists(bad))
            proc = get(srv.address, "sub/w.bin", bad, *self.pki("client"), "--tls-pin", "sha256:abc")
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertIn("want sha256:<64 hex digits>", proc.stderr)
            proc = get(srv.address, "sub/w.bin", bad, "--no-tls", "--tls-server-name", "x")
            self.assertEqual(proc.returncode, 2, proc.stderr)
        finally:
            srv.stop()
        # A client the server does not list is refused (and the server says why).
        srv = Server(self.root, *self.pki("server"), "--tls-allow-client", "other.tern.test")
        try:
            bad = self.out("unlisted.bin")
            proc = get(srv.address, "sub/w.bin", bad, *self.pki("client"), "--retries", "0")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("the server refused our TLS certificate", proc.stderr)
            self.assertFalse(os.path.exists(bad))
        finally:
            rc, err = srv.stop()
        self.assertIn("none of the allowed clients (other.tern.test)", err)

    def test_names_outside_the_root_are_refused(self):
        srv = Server(self.root, "--no-tls")
        try:
            for name in ("../secret", "/etc/passwd", "sub/../../secret", "nope.bin"):
                with self.subTest(name):
                    path = self.out("escape.bin")
                    proc = get(srv.address, name, path, "--no-tls", "--retries", "0")
                    self.assertNotEqual(proc.returncode, 0)
                    self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
                    # Refused before any byte arrived: nothing kept for a resume
                    # (a 64 MiB LOCAL.tern-part was left behind).
                    for p in (path, path + ".tern-part", path + ".tern-part.state"):
                        self.assertFalse(os.path.exists(p), p)
        finally:
            srv.stop()

    def test_serving_the_filesystem_root(self):
        # `serve /` refused every file as escaping the root.
        srv = Server("/", "--no-tls")
        try:
            path = self.out("slash.bin")
            name = os.path.realpath(os.path.join(self.root, "sub", "w.bin")).lstrip("/")
            self.assert_copy(get(srv.address, name, path, "--no-tls", "--retries", "0"), path)
            proc = get(srv.address, "../" + name, self.out("slash-up.bin"), "--no-tls", "--retries", "0")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("escapes the served root", proc.stderr)
        finally:
            srv.stop()

    def test_ucx_transport_between_processes(self):
        srv = Server(self.root, "--transport", "ucx", "--no-tls", env=LOOPBACK_UCX)
        try:
            path = self.out("ucx.bin")
            s = self.assert_copy(get(srv.address, "sub/w.bin", path, "--transport", "ucx", "--no-tls",
                                     env=LOOPBACK_UCX), path)
            self.assertIn("ucx", s["link"])
            self.assertNotIn("eth", s["link"])  # loopback only
        finally:
            srv.stop()

    def test_a_restarted_server_listens_on_its_port_again(self):
        # A server stopped while peers are connected leaves its port in
        # TIME_WAIT; the next one must still listen there. tcp binds with
        # SO_REUSEADDR; UCX 1.13 only when UCX_TCP_CM_REUSEADDR=y, which the
        # CLI sets unless the environment does (it failed before, with
        # "ucx: listen on ...: Device is busy").
        for name, flags, env in (("tcp", ("--no-tls",), {}),
                                 ("ucx", ("--transport", "ucx", "--no-tls"), LOOPBACK_UCX)):
            with self.subTest(name):
                srv = Server(self.root, *flags, env=env)
                host, port = srv.address.rsplit(":", 1)
                path = self.out(name + "-restart.bin")
                try:
                    self.assert_copy(get(srv.address, "sub/w.bin", path, *flags, env=env), path)
                    peer = socket.create_connection((host, int(port)), timeout=10)
                finally:
                    srv.stop()
                try:
                    again = Server(self.root, *flags, env=env, listen=srv.address)
                    again.stop()
                finally:
                    peer.close()

    def test_rdma_transports_need_an_explicit_no_tls_and_a_device(self):
        for t in ("ucx", "verbs"):
            proc = get("127.0.0.1:1", "x", self.out("x.bin"), "--transport", t)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertIn("carries no encryption", proc.stderr)
        proc = get("127.0.0.1:1", "x", self.out("x.bin"), "--transport", "rdma", "--no-tls")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("want tcp, ucx or verbs", proc.stderr)
        proc = get("127.0.0.1:1", "x", self.out("x.bin"), "--verbs-device", "mlx5_0", "--no-tls")
        self.assertEqual(proc.returncode, 2)
        proc = subprocess.run([TERN, "transports"], capture_output=True, text=True, timeout=60)
        if re.search(r"^verbs\s+available", proc.stdout, re.M):
            self.skipTest("an RDMA device is present; the no-device message is not shown")
        proc = get("127.0.0.1:1", "x", self.out("x.bin"), "--transport", "verbs", "--no-tls")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("verbs:", proc.stderr)
        self.assertRegex(proc.stderr, r"0 devices|cannot load|no active port")


if __name__ == "__main__":
    TERN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
