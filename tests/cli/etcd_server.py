"""A real etcd on 127.0.0.1 for the CLI tests, as agent/testing/etcd_test_server.cc
starts one for the C++ tests: `$TERN_ETCD`, else `etcd` from PATH (Debian's
etcd-server, installed by scripts/install-deps.sh), a one-member cluster on
two free loopback ports with a fresh data directory, 50 ms heartbeats and a
250 ms election timeout (so that 1-2 s leases work). With `tls` it serves
https only and wants a client certificate from the same CA (etcd's
--client-cert-auth), as a deployment's etcd should."""
import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request

_PR_SET_PDEATHSIG = 1
# Loopback only: never through a proxy from the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def die_with_parent():
    """preexec_fn: the child gets SIGKILL when the test process dies, even
    when the test itself is killed (nothing outlives it)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_ports(n):
    """n distinct free loopback ports (held open together so they differ). A
    race with another process before they are bound again is possible: the
    caller retries where it can."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def find_etcd():
    env = os.environ.get("TERN_ETCD")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("etcd")


class EtcdServer:
    """Start() returns None exactly when there is no etcd binary (a test
    skips on that and fails on anything else)."""

    def __init__(self, binary, parent_dir, host="127.0.0.1", tls=None):
        self.binary = binary
        self.host = host
        self.tls = tls
        self.dir = tempfile.mkdtemp(prefix="etcd-", dir=parent_dir)
        self.proc = None
        self.client_port = 0

    @classmethod
    def start(cls, parent_dir, start_timeout_s=15, host="127.0.0.1", tls=None):
        """host: the address it listens on (the soak's WAN mode gives a
        testbed host's, started inside that host's network namespace).
        tls: {"ca", "cert", "key"} PEM paths; the certificate serves and is
        the health check's client certificate too, so it needs both
        extended key usages and an IP SAN of host."""
        binary = find_etcd()
        if binary is None:
            return None
        server = cls(binary, parent_dir, host, tls)
        last = None
        for attempt in range(3):
            try:
                server._launch(attempt)
                server._wait_healthy(start_timeout_s)
                return server
            except AssertionError as e:
                last = e
                server.kill()
        raise last

    @property
    def endpoint(self):
        return "%s:%d" % (self.host, self.client_port)

    def _launch(self, attempt):
        self.client_port, peer_port = free_ports(2)
        client = "%s://%s:%d" % ("https" if self.tls else "http", self.host, self.client_port)
        peer = "http://%s:%d" % (self.host, peer_port)
        tls = []
        if self.tls:
            tls = ["--cert-file=" + self.tls["cert"], "--key-file=" + self.tls["key"],
                   "--trusted-ca-file=" + self.tls["ca"], "--client-cert-auth"]
        self.log_path = os.path.join(self.dir, "etcd-%d.log" % attempt)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--name=tern-test", "--data-dir=" + os.path.join(self.dir, "data-%d" % attempt),
                 "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
                 "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
                 "--initial-cluster=tern-test=" + peer, "--initial-cluster-state=new",
                 "--heartbeat-interval=50", "--election-timeout=250", "--logger=zap", "--log-level=warn"] + tls,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                preexec_fn=die_with_parent)

    def _log_tail(self):
        with open(self.log_path) as f:
            return f.read()[-600:]

    def _health_opener(self):
        if not self.tls:
            return _NO_PROXY, "http"
        context = ssl.create_default_context(cafile=self.tls["ca"])
        context.load_cert_chain(self.tls["cert"], self.tls["key"])
        return urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                           urllib.request.HTTPSHandler(context=context)), "https"

    def _wait_healthy(self, seconds):
        opener, scheme = self._health_opener()
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("etcd exited during start (%d): %s" % (self.proc.returncode, self._log_tail()))
            try:
                # /health is true only once the member has a raft leader.
                with opener.open("%s://%s/health" % (scheme, self.endpoint), timeout=0.5) as r:
                    if r.status == 200 and b'"true"' in r.read():
                        return
            except OSError as e:  # not up yet; a certificate mistake is said now, not retried
                why = getattr(e, "reason", e)
                if isinstance(why, ssl.SSLCertVerificationError):
                    raise AssertionError("etcd's certificate was refused: %s" % why) from e
            time.sleep(0.05)
        raise AssertionError("etcd not healthy after %d s: %s" % (seconds, self._log_tail()))

    def kill(self):
        """SIGKILL to etcd's process group, waited for (bounded)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def close(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
