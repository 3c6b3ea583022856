#!/usr/bin/env python3
"""End-to-end tests of the `tern` patch commands on real files.

Usage: test_cli.py PATH_TO_TERN. Builds a small datagen trace, then checks
diff -> apply is bitwise in every checkpoint form (single file, directory,
sharded directory), squash, inspect and digest agree, and that bad input
(truncated or bit-flipped patches, a wrong base, mismatched layouts, bad
flags) fails with a one-line error, a non-zero exit and no output left behind.
"""
import filecmp
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

TERN = None


def run(*args, ok=True):
    proc = subprocess.run([TERN, *map(str, args)], capture_output=True, text=True, timeout=300)
    if ok and proc.returncode != 0:
        raise AssertionError(f"tern {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout}{proc.stderr}")
    return proc


def read_safetensors(path):
    """(header without __metadata__, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return header, data


def same_checkpoint(a, b):
    """Same serve view and same layout: identical tensor headers and bytes in
    every safetensors file, identical other files. The __metadata__ may differ
    (datagen records the step there; a patch carries tensors, not metadata)."""
    def same_file(x, y):
        if x.endswith(".safetensors"):
            return read_safetensors(x) == read_safetensors(y)
        return filecmp.cmp(x, y, shallow=False)
    if os.path.isfile(a):
        return same_file(a, b)
    names_a, names_b = sorted(os.listdir(a)), sorted(os.listdir(b))
    if names_a != names_b:
        return False
    return all(same_file(os.path.join(a, n), os.path.join(b, n)) for n in names_a)


def write_safetensors(path, tensors, metadata=None):
    """A minimal independent safetensors writer: {name: (dtype, shape, bytes)}."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


class PatchCommands(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tern-cli-test-")
        cls.trace = os.path.join(cls.tmp, "trace")
        run("datagen", "--out", cls.trace, "--params", "300K", "--steps", 3, "--lr", "1e-5",
            "--seed", 7, "--threads", 2)
        cls.steps = sorted(os.path.join(cls.trace, d) for d in os.listdir(cls.trace))
        cls.sharded = os.path.join(cls.tmp, "sharded")
        run("datagen", "--out", cls.sharded, "--params", "300K", "--steps", 2, "--lr", "1e-5",
            "--seed", 7, "--shard-bytes", "150000")
        cls.shard_steps = sorted(os.path.join(cls.sharded, d) for d in os.listdir(cls.sharded))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def diff(self, old, new, name):
        out = self.path(name)
        if os.path.exists(out):
            os.remove(out)
        run("diff", old, new, "-o", out)
        return out

    def test_trace_has_versions_in_order(self):
        self.assertEqual([os.path.basename(s) for s in self.steps],
                         ["step-000000", "step-000001", "step-000002", "step-000003"])

    def test_diff_apply_is_bitwise_and_digests_agree(self):
        for i in range(len(self.steps) - 1):
            patch = self.diff(self.steps[i], self.steps[i + 1], f"p{i}.patch")
            out = self.path(f"applied{i}")
            run("apply", self.steps[i], patch, "-o", out, "--verify-full")
            self.assertTrue(same_checkpoint(out, self.steps[i + 1]), f"step {i + 1} differs")
            self.assertEqual(run("digest", out).stdout, run("digest", self.steps[i + 1]).stdout)
            info = json.loads(run("inspect", patch, "--json").stdout)
            self.assertEqual(info["base_digest"], run("digest", self.steps[i]).stdout.strip())
            self.assertEqual(info["target_digest"], run("digest", self.steps[i + 1]).stdout.strip())
            self.assertEqual((info["base_version"], info["target_version"]), (i, i + 1))
            self.assertGreater(info["changed_elements"], 0)
            self.assertEqual(info["patch_bytes"], os.path.getsize(patch))
            shutil.rmtree(out)

    def test_format_versions(self):
        sizes = {}
        for version in (1, 2):
            out = self.path(f"v{version}.patch")
            if os.path.exists(out):
                os.remove(out)
            run("diff", self.steps[1], self.steps[2], "-o", out, "--format-version", version)
            info = json.loads(run("inspect", out, "--json").stdout)
            self.assertEqual(info["format_version"], version)
            applied = self.path(f"applied-v{version}")
            run("apply", self.steps[1], out, "-o", applied)
            self.assertTrue(same_checkpoint(applied, self.steps[2]))
            shutil.rmtree(applied)
            sizes[version] = os.path.getsize(out)
        self.assertLess(sizes[2], sizes[1])  # datagen flips follow the base's exponent
        # Squashing format 2 needs the base: refused with a reason, nothing written.
        out = self.path("squashed-v2.patch")
        r = run("squash", self.path("v2.patch"), self.path("v2.patch"), "-o", out, ok=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("needs the base", r.stderr)
        self.assertFalse(os.path.exists(out))
        r = run("diff", self.steps[1], self.steps[2], "-o", self.path("v3.patch"), "--format-version", 3,
                ok=False)
        self.assertEqual(r.returncode, 2)

    def test_sharded_checkpoint(self):
        self.assertTrue(os.path.exists(
            os.path.join(self.shard_steps[0], "model.safetensors.index.json")))
        patch = self.diff(self.shard_steps[0], self.shard_steps[2], "sharded.patch")
        out = self.path("sharded-out")
        run("apply", self.shard_steps[0], patch, "-o", out)
        self.assertTrue(same_checkpoint(out, self.shard_steps[2]))
        # Sharding does not change the view digest.
        self.assertEqual(run("digest", self.shard_steps[2]).stdout, run("digest", self.steps[2]).stdout)
        shutil.rmtree(out)

    def test_single_file_checkpoint_with_every_width(self):
        import random
        rng = random.Random(5)
        old_t = {
            "a.f32": ("F32", [3, 5], bytes(rng.getrandbits(8) for _ in range(60))),
            "b.bf16": ("BF16", [1000], bytes(rng.getrandbits(8) for _ in range(2000))),
            "c.u8": ("U8", [77], bytes(rng.getrandbits(8) for _ in range(77))),
            "d.f64": ("F64", [9], bytes(rng.getrandbits(8) for _ in range(72))),
            "e.f4": ("F4", [64], bytes(rng.getrandbits(8) for _ in range(32))),
        }
        new_t = {}
        for name, (dt, shape, data) in old_t.items():
            data = bytearray(data)
            for _ in range(max(1, len(data) // 20)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            new_t[name] = (dt, shape, bytes(data))
        old, new = self.path("old.safetensors"), self.path("new.safetensors")
        write_safetensors(old, old_t, {"format": "pt"})
        write_safetensors(new, new_t, {"format": "pt"})
        patch = self.diff(old, new, "single.patch")
        out = self.path("single-out.safetensors")
        run("apply", old, patch, "-o", out)
        self.assertTrue(same_checkpoint(out, new))
        os.remove(out)

    def test_packed_codes_are_coded_as_nibbles(self):
        # Packed 4-bit codes (two a U8, eight an I32) moved one nibble at a
        # time: format 2 codes them as nibbles, which the file calls version 3.
        import random
        rng = random.Random(7)
        steps = [{
            "codes": ("U8", [4096], bytes(rng.getrandbits(8) for _ in range(4096))),
            "qweight": ("I32", [1024], bytes(rng.getrandbits(8) for _ in range(4096))),
        }]
        for _ in range(2):
            step = {}
            for name, (dt, shape, data) in steps[-1].items():
                data = bytearray(data)
                for _ in range(len(data) // 100):
                    nib = rng.randrange(2 * len(data))
                    byte, high = nib // 2, nib % 2
                    v = (data[byte] >> (4 * high)) & 15
                    v2 = (v + rng.choice((1, 15))) & 15
                    data[byte] = (data[byte] & (0x0F if high else 0xF0)) | (v2 << (4 * high))
                step[name] = (dt, shape, bytes(data))
            steps.append(step)
        files = []
        for i, t in enumerate(steps):
            files.append(self.path(f"packed{i}.safetensors"))
            write_safetensors(files[-1], t, {"format": "pt"})
        p01 = self.diff(files[0], files[1], "packed01.patch")
        p12 = self.diff(files[1], files[2], "packed12.patch")
        info = json.loads(run("inspect", p01, "--json").stdout)
        self.assertEqual(info["format_version"], 3)
        self.assertEqual([t["nibbles"] for t in info["tensors"]], [True, True])
        self.assertIn("U8/nib", run("inspect", p01).stdout)
        v1 = self.path("packed01-v1.patch")
        if os.path.exists(v1):
            os.remove(v1)
        run("diff", files[0], files[1], "-o", v1, "--format-version", 1)
        info1 = json.loads(run("inspect", v1, "--json").stdout)
        self.assertEqual(info1["changed_elements"], info["changed_elements"])
        self.assertLess(info["patch_bytes"], info1["patch_bytes"])
        out = self.path("packed-out.safetensors")
        run("apply", files[0], p01, "-o", out)
        self.assertTrue(same_checkpoint(out, files[1]))
        os.remove(out)
        # Both code the tensors as nibbles: they squash without the base.
        squashed = self.path("packed02.patch")
        if os.path.exists(squashed):
            os.remove(squashed)
        run("squash", p01, p12, "-o", squashed)
        self.assertEqual(json.loads(run("inspect", squashed, "--json").stdout)["format_version"], 3)
        run("apply", files[0], squashed, "-o", out)
        self.assertTrue(same_checkpoint(out, files[2]))
        os.remove(out)
        # --no-nibbles: format 2 coded by bytes, file version 2, for readers
        # that predate version 3; larger, and the same changes.
        v2 = self.path("packed01-v2.patch")
        run("diff", files[0], files[1], "-o", v2, "--no-nibbles", "--force")
        info2 = json.loads(run("inspect", v2, "--json").stdout)
        self.assertEqual(info2["format_version"], 2)
        self.assertEqual([t["nibbles"] for t in info2["tensors"]], [False, False])
        self.assertEqual(info2["changed_elements"], info["changed_elements"])
        self.assertLess(info["patch_bytes"], info2["patch_bytes"])
        run("apply", files[0], v2, "-o", out)
        self.assertTrue(same_checkpoint(out, files[1]))
        os.remove(out)
        run("squash", p01, p12, "-o", squashed, "--base", files[0], "--no-nibbles", "--force")
        self.assertEqual(json.loads(run("inspect", squashed, "--json").stdout)["format_version"], 2)
        run("apply", files[0], squashed, "-o", out)
        self.assertTrue(same_checkpoint(out, files[2]))
        os.remove(out)
        # Without the base, nibble-coded inputs cannot become version 2.
        r = run("squash", p01, p12, "-o", squashed, "--no-nibbles", "--force", ok=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("nibble coding is off", r.stderr)
        self.assertIn("--base", r.stderr)
        # Inputs coded by elements squash without it: version 1 (no CONTEXT).
        e01, e12 = self.path("packed01-f1.patch"), self.path("packed12-f1.patch")
        run("diff", files[0], files[1], "-o", e01, "--format-version", "1", "--force")
        run("diff", files[1], files[2], "-o", e12, "--format-version", "1", "--force")
        run("squash", e01, e12, "-o", squashed, "--no-nibbles", "--force")
        self.assertEqual(json.loads(run("inspect", squashed, "--json").stdout)["format_version"], 1)
        run("apply", files[0], squashed, "-o", out)
        self.assertTrue(same_checkpoint(out, files[2]))
        os.remove(out)

    def test_squash_equals_chain(self):
        # diff writes format 2 by default: its squash needs the first base.
        p01 = self.diff(self.steps[0], self.steps[1], "s01.patch")
        p12 = self.diff(self.steps[1], self.steps[2], "s12.patch")
        p23 = self.diff(self.steps[2], self.steps[3], "s23.patch")
        self.assertEqual(json.loads(run("inspect", p01, "--json").stdout)["format_version"], 2)
        squashed = self.path("s03.patch")
        if os.path.exists(squashed):
            os.remove(squashed)
        r = run("squash", p01, p12, p23, "-o", squashed, ok=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--base", r.stderr)
        self.assertFalse(os.path.exists(squashed))
        for fmt in (2, 1):
            run("squash", p01, p12, p23, "--base", self.steps[0], "--format-version", fmt, "-o", squashed,
                "--force")
            self.assert_squash_reaches(squashed, fmt)
        # Format-1 patches squash without the base, into format 1.
        f1 = []
        for a, b in ((0, 1), (1, 2), (2, 3)):
            out = self.path(f"f1-{a}{b}.patch")
            if os.path.exists(out):
                os.remove(out)
            run("diff", self.steps[a], self.steps[b], "-o", out, "--format-version", 1)
            f1.append(out)
        run("squash", *f1, "-o", squashed, "--force")
        self.assert_squash_reaches(squashed, 1)
        # --format-version means nothing without the base.
        r = run("squash", *f1, "-o", self.path("f2.patch"), "--format-version", 2, ok=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertFalse(os.path.exists(self.path("f2.patch")))
        # Out of order: the digests do not chain.
        bad = run("squash", p12, p01, "-o", self.path("bad.patch"), ok=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertFalse(os.path.exists(self.path("bad.patch")))
        bad = run("squash", p12, p01, "--base", self.steps[1], "-o", self.path("bad.patch"), ok=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertFalse(os.path.exists(self.path("bad.patch")))

    def assert_squash_reaches(self, squashed, fmt):
        out = self.path("squashed-out")
        run("apply", self.steps[0], squashed, "-o", out)
        self.assertTrue(same_checkpoint(out, self.steps[3]))
        info = json.loads(run("inspect", squashed, "--json").stdout)
        self.assertEqual((info["base_version"], info["target_version"], info["format_version"]), (0, 3, fmt))
        shutil.rmtree(out)

    def assert_refused(self, proc, out, needle=None):
        self.assertNotEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertFalse(os.path.exists(out), f"{out} left behind")
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, f"expected a one-line error, got: {proc.stderr!r}")
        self.assertTrue(lines[0].startswith("tern "), lines[0])
        if needle:
            self.assertIn(needle, lines[0])
        leftovers = [n for n in os.listdir(os.path.dirname(out)) if ".tmp" in n]
        self.assertEqual(leftovers, [], "staging files left behind")

    def test_wrong_base_is_refused(self):
        patch = self.diff(self.steps[1], self.steps[2], "w12.patch")
        out = self.path("wrong-base-out")
        self.assert_refused(run("apply", self.steps[0], patch, "-o", out, ok=False), out, "mismatch")

    def test_damaged_patches_are_refused(self):
        patch = self.diff(self.steps[0], self.steps[1], "d01.patch")
        with open(patch, "rb") as f:
            data = f.read()
        out = self.path("damaged-out")
        cases = {"truncated-half": data[: len(data) // 2], "truncated-1": data[:-1],
                 "empty": b"", "garbage": b"\x00" * 4096}
        for pos in (0, 9, 40, len(data) // 3, len(data) // 2, len(data) - 20, len(data) - 1):
            flipped = bytearray(data)
            flipped[pos] ^= 0x10
            cases[f"flip-{pos}"] = bytes(flipped)
        for name, blob in cases.items():
            with self.subTest(name):
                bad = self.path(f"bad-{name}.patch")
                with open(bad, "wb") as f:
                    f.write(blob)
                self.assert_refused(run("apply", self.steps[0], bad, "-o", out, ok=False), out)
                proc = run("inspect", bad, ok=False)
                self.assertNotEqual(proc.returncode, 0)

    def test_layout_mismatch_is_refused(self):
        other = self.path("other-trace")
        run("datagen", "--out", other, "--params", "200K", "--steps", 0, "--seed", 7)
        out = self.path("mismatch.patch")
        proc = run("diff", self.steps[0], os.path.join(other, "step-000000"), "-o", out, ok=False)
        self.assert_refused(proc, out, "mismatch")

    def test_existing_output_is_not_replaced(self):
        patch = self.diff(self.steps[0], self.steps[1], "e01.patch")
        with open(patch, "rb") as f:
            before = f.read()
        proc = run("diff", self.steps[0], self.steps[2], "-o", patch, ok=False)
        self.assertNotEqual(proc.returncode, 0)
        with open(patch, "rb") as f:
            self.assertEqual(f.read(), before)

    def test_usage_errors(self):
        for args in (["diff"], ["diff", "a", "b"], ["apply", "--bogus", "x"], ["nonsense"]):
            with self.subTest(args):
                proc = run(*args, ok=False)
                self.assertEqual(proc.returncode, 2, proc.stderr)
        proc = run("digest", self.path("does-not-exist"), ok=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("not found", proc.stderr)
        for cmd in ("diff", "apply", "squash", "inspect", "digest", "datagen", "demo"):
            self.assertIn("usage: tern " + cmd, run(cmd, "--help").stdout)


class ExitStatusAndFlags(unittest.TestCase):
    """docs/cli.md: 2 = the command line was refused before any work, 1 = the
    command failed, 0 = success; integer flags parse exactly; no output is
    replaced without --force."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tern-cli-exit-")
        cls.trace = os.path.join(cls.tmp, "trace")
        run("datagen", "--out", cls.trace, "--params", "200K", "--steps", 2, "--seed", 3,
            "--threads", 1)
        cls.v0, cls.v1, cls.v2 = (os.path.join(cls.trace, f"step-00000{i}") for i in range(3))
        cls.patch = os.path.join(cls.tmp, "p01.patch")
        run("diff", cls.v0, cls.v1, "-o", cls.patch)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def assert_status(self, args, status, needles=()):
        proc = run(*args, ok=False)
        self.assertEqual(proc.returncode, status, f"tern {args}: {proc.stderr}")
        if status != 0:
            lines = [l for l in proc.stderr.splitlines() if l.strip()]
            self.assertEqual(len(lines), 1, f"tern {args}: expected one line, got {proc.stderr!r}")
            self.assertRegex(lines[0], r"^tern[ :]")
            for needle in needles:
                self.assertIn(needle, lines[0])
        return proc

    def test_usage_errors_exit_2_and_do_no_work(self):
        out = self.path("never")
        cases = [
            (["nonsense"], ["unknown command 'nonsense'"]),
            ([], ["command"]),
            (["xfer"], ["command"]),
            (["diff", self.v0, self.v1, "-o", out, "--bogus"], ["--bogus"]),
            (["diff", self.v0, "-o", out], ["NEW"]),
            (["diff", self.v0, self.v1, self.v2, "-o", out], [self.v2]),
            (["diff", self.v0, self.v1], ["--out"]),
            (["squash", self.patch, "-o", out], ["PATCH"]),
            (["diff", self.v0, self.v1, "-o", out, "--seed", "1"], ["--seed"]),
            (["diff", self.v0, self.v1, "-o", out, "--threads", "1025"], ["--threads", "1025"]),
            (["datagen", "--out", out, "--format", "nvfp4", "--dtype", "fp16"], ["contradicts"]),
            (["datagen", "--out", out, "--params", "10"], ["--params"]),
            (["datagen", "--out", out, "--lr", "nan"], ["--lr", "'nan'"]),
            (["datagen", "--out", out, "--seed", "1", "--seed", "2"], ["--seed"]),
            (["cast", "--format", "fp9", self.v0, "-o", out], ["fp9"]),
            (["xfer", "get", "127.0.0.1:1", "x", "-o", out, "--transport", "ucx"],
             ["carries no encryption"]),
            (["xfer", "get", "127.0.0.1:1", "x", "-o", out, "--no-tls", "--streams", "65"],
             ["--streams"]),
            (["xfer", "get", "127.0.0.1:1", "x", "-o", out, "--no-tls", "--min-wire-version", "0"],
             ["--min-wire-version", "want 1 or 2"]),
        ]
        # Integers: plain decimal only, exact, within the type.
        for flag, value in (("--base-version", "0x10"), ("--base-version", "1e3"),
                            ("--base-version", "-1"), ("--base-version", "+1"),
                            ("--base-version", "1.0"), ("--base-version", "12abc"),
                            ("--base-version", ""), ("--base-version", "18446744073709551616"),
                            ("--target-version", "99999999999999999999999"),
                            ("--segment-elements", "1e6"), ("--segment-elements", "0x100000"),
                            ("--segment-elements", "1.5"), ("--segment-elements", "18446744073709552K")):
            cases.append((["diff", self.v0, self.v1, "-o", out, f"{flag}={value}"],
                          [flag, f"'{value}'"] if value else [flag]))
        for flag, value in (("--chunk", "4MB"), ("--chunk", "1e6"), ("--rtt-ms", "0x10"),
                            ("--retries", "-1"), ("--streams", "1e1"), ("--rate-hint", "1.5"),
                            ("--idle-timeout-ms", "18446744073709551616"),
                            ("--min-wire-version", "3"), ("--min-frame-rate", "1.5"),
                            ("--min-frame-rate", "64KB")):
            cases.append((["xfer", "get", "127.0.0.1:1", "x", "-o", out, "--no-tls",
                           f"{flag}={value}"], [flag, f"'{value}'"]))
        for args, needles in cases:
            with self.subTest(args):
                self.assert_status(args, 2, needles)
                self.assertFalse(os.path.exists(out))

    def test_failures_exit_1(self):
        garbage = self.path("garbage.patch")
        with open(garbage, "wb") as f:
            f.write(b"\x00" * 4096)
        other = self.path("other-trace")
        run("datagen", "--out", other, "--params", "300K", "--steps", 0)
        out = self.path("never")
        cases = [
            (["digest", self.path("does-not-exist")], ["not found"]),
            (["inspect", self.path("does-not-exist")], ["not found"]),
            (["inspect", garbage], []),
            # A directory where a patch file belongs: bad input, not bad usage
            # (it exited 2 before).
            (["inspect", self.trace], ["not a regular file"]),
            (["apply", self.v0, self.trace, "-o", out], ["not a regular file"]),
            (["apply", self.v1, self.patch, "-o", out], ["mismatch"]),
            (["diff", self.v0, os.path.join(other, "step-000000"), "-o", out], ["mismatch"]),
            (["xfer", "get", "127.0.0.1:1", "x", "-o", out, "--no-tls", "--retries", "0"], []),
        ]
        for args, needles in cases:
            with self.subTest(args):
                self.assert_status(args, 1, needles)
                self.assertFalse(os.path.exists(out))

    def test_success_and_help_exit_0(self):
        self.assert_status(["version"], 0)
        self.assert_status(["digest", self.v0], 0)
        top = self.assert_status(["--help"], 0).stdout
        for cmd in ("datagen", "diff", "apply", "squash", "inspect", "digest", "cast", "xfer",
                    "transports", "demo", "version"):
            self.assertIn(cmd, top)
        for args in (["diff"], ["apply"], ["squash"], ["inspect"], ["digest"], ["datagen"],
                     ["demo"], ["cast"], ["transports"], ["xfer"], ["xfer", "serve"],
                     ["xfer", "get"]):
            with self.subTest(args):
                proc = self.assert_status([*args, "--help"], 0)
                self.assertIn("usage: tern " + " ".join(args), proc.stdout)

    def test_integers_are_exact_over_the_whole_u64_range(self):
        # 2^64-1 was refused and 2^53+1 stored as 2^53 when numbers were doubles.
        out = self.path("exact.patch")
        run("diff", self.v0, self.v1, "-o", out, "--base-version", "18446744073709551615",
            "--target-version", "9007199254740993")
        info = json.loads(run("inspect", out, "--json").stdout)
        self.assertEqual(info["base_version"], 18446744073709551615)
        self.assertEqual(info["target_version"], 9007199254740993)
        os.remove(out)
        # Sizes: a suffix and a fraction that leaves a whole number are exact.
        run("diff", self.v0, self.v1, "-o", out, "--segment-elements", "0.065536M")
        self.assertEqual(json.loads(run("inspect", out, "--json").stdout)["segments"],
                         json.loads(run("inspect", self.diff_with(65536), "--json").stdout)["segments"])
        os.remove(out)

    def diff_with(self, segment_elements):
        out = self.path(f"seg-{segment_elements}.patch")
        if not os.path.exists(out):
            run("diff", self.v0, self.v1, "-o", out, "--segment-elements", segment_elements)
        return out

    def test_no_output_is_replaced_without_force(self):
        def keep(path, args):
            before = open(path, "rb").read() if os.path.isfile(path) else sorted(os.listdir(path))
            self.assert_status(args, 1, ["exists" if os.path.isfile(path) else "not empty"])
            after = open(path, "rb").read() if os.path.isfile(path) else sorted(os.listdir(path))
            self.assertEqual(before, after)
            self.assertEqual(run(*args, "--force").returncode, 0)

        existing = self.path("existing.patch")
        with open(existing, "wb") as f:
            f.write(b"keep me")
        keep(existing, ["diff", self.v0, self.v1, "-o", existing])
        with open(existing, "wb") as f:
            f.write(b"keep me")
        p12 = self.diff_with(7)  # any patch; squash needs a chain
        run("diff", self.v1, self.v2, "-o", self.path("p12.patch"))
        keep(existing, ["squash", self.patch, self.path("p12.patch"), "--base", self.v0, "-o", existing])
        with open(existing, "wb") as f:
            f.write(b"keep me")
        keep(existing, ["apply", self.v0, self.patch, "-o", existing])
        cast = self.path("cast.safetensors")
        with open(cast, "wb") as f:
            f.write(b"keep me")
        keep(cast, ["cast", "--format", "fp8-e4m3-tensor", self.v0, "-o", cast])
        self.assertEqual(run("cast", "--format", "fp8-e4m3-tensor", self.v0, "-o", cast,
                             "--overwrite").returncode, 0)
        keep(self.trace, ["datagen", "--out", self.trace, "--params", "200K", "--steps", 2,
                          "--seed", 3, "--threads", 1])
        del p12


if __name__ == "__main__":
    TERN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
