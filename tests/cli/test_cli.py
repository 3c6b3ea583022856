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

    def test_squash_equals_chain(self):
        p01 = self.diff(self.steps[0], self.steps[1], "s01.patch")
        p12 = self.diff(self.steps[1], self.steps[2], "s12.patch")
        p23 = self.diff(self.steps[2], self.steps[3], "s23.patch")
        squashed = self.path("s03.patch")
        run("squash", p01, p12, p23, "-o", squashed)
        out = self.path("squashed-out")
        run("apply", self.steps[0], squashed, "-o", out)
        self.assertTrue(same_checkpoint(out, self.steps[3]))
        info = json.loads(run("inspect", squashed, "--json").stdout)
        self.assertEqual((info["base_version"], info["target_version"]), (0, 3))
        shutil.rmtree(out)
        # Out of order: the digests do not chain.
        bad = run("squash", p12, p01, "-o", self.path("bad.patch"), ok=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertFalse(os.path.exists(self.path("bad.patch")))

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


if __name__ == "__main__":
    TERN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
