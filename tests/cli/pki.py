"""Test certificates, made with the openssl command line: one place for the
CLI tests, the soak and the benchmarks (they used to carry a copy each).

    ca = Ca(d)                                  # d/ca.key, d/ca.pem
    pem, key = ca.issue("node", ["IP:127.0.0.1", "DNS:localhost"])
    flags = node_pki(d)                         # tern-agent's --tls-* flags

Every key is P-256. Certificates are for tests and benchmarks on this
machine: a short life (`days`), keys unencrypted.
"""
import os
import subprocess

# libfaketime, which backdates a certificate: openssl 3.0 (Debian 12) has no
# -not_before for `x509 -req`, and `openssl ca` wants a CA database.
FAKETIME_LIBS = ["/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
                 "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"]


def faketime_lib():
    """The libfaketime this machine has, or None."""
    return next((p for p in FAKETIME_LIBS if os.path.exists(p)), None)


class Ca:
    """A certificate authority in directory `d` (created if missing):
    NAME.key and NAME.pem. With backdate_s, certificates it makes (its own
    included) are valid from that many seconds ago, as a real fleet's were
    issued before it started: needed when a test sets a process's clock
    back. That takes libfaketime; `backdated` says whether it was there."""

    def __init__(self, d, name="ca", days=2, backdate_s=0):
        os.makedirs(d, exist_ok=True)
        self.dir, self.name, self.days = d, name, days
        lib = faketime_lib() if backdate_s else None
        self.backdated = lib is not None
        self._env = dict(os.environ)
        if lib:
            self._env.update(LD_PRELOAD=lib, FAKETIME="-%ds" % backdate_s, FAKETIME_DONT_RESET="1")
        self.pem, self.key = self.path(name + ".pem"), self.path(name + ".key")
        self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                      "-days", str(days), "-subj", "/CN=" + name, "-keyout", self.key, "-out", self.pem)

    def path(self, file_name):
        return os.path.join(self.dir, file_name)

    def _openssl(self, *args):
        r = subprocess.run(["openssl", *args], cwd=self.dir, env=self._env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("openssl %s: %s" % (args[0], r.stderr.strip()[-400:]))

    def issue(self, name, sans, eku="serverAuth,clientAuth", cn=None):
        """NAME.pem and NAME.key signed by this CA, naming `sans`
        ("IP:127.0.0.1", "DNS:localhost", ...); eku None leaves the extended
        key usage out (any use). Returns (pem path, key path)."""
        with open(self.path(name + ".cnf"), "w") as f:
            f.write("subjectAltName=%s\n" % ",".join(sans))
            if eku:
                f.write("extendedKeyUsage=%s\n" % eku)
        pem, key = self.path(name + ".pem"), self.path(name + ".key")
        self._openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj",
                      "/CN=" + (cn or name), "-keyout", key, "-out", self.path(name + ".csr"))
        self._openssl("x509", "-req", "-in", self.path(name + ".csr"), "-CA", self.pem, "-CAkey", self.key,
                      "-CAserial", self.path(self.name + ".srl"), "-CAcreateserial", "-days", str(self.days),
                      "-extfile", self.path(name + ".cnf"), "-out", pem)
        return pem, key


def node_pki(d, addresses=()):
    """The one-certificate set-up of the agent tests and benchmarks: a CA
    (d/ca.pem) and d/node.pem + d/node.key for 127.0.0.1, localhost and
    `addresses`, server and client use. Returns tern-agent's flags for it."""
    ca = Ca(d)
    sans = ["IP:127.0.0.1", "DNS:localhost"] + ["IP:" + a for a in addresses if a != "127.0.0.1"]
    pem, key = ca.issue("node", sans)
    return ["--tls-cert", pem, "--tls-key", key, "--tls-ca", ca.pem]
