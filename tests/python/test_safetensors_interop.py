#!/usr/bin/env python3
"""Interop between tern's safetensors I/O and the reference `safetensors` library.

Usage: test_safetensors_interop.py PATH/TO/safetensors_interop_helper

Checks, both ways, that every dtype, shape, byte and __metadata__ entry
survives: files tern writes load with the reference library (and with numpy
where numpy has the dtype), files the reference writes open with tern, tern's
header is byte-identical to the reference writer's for the same tensors, and
sharded checkpoints follow the transformers index layout. A dtype this
safetensors/numpy lacks is skipped with a printed reason.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import safetensors
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover - install-deps.sh installs it
    print(f"FAIL: the reference safetensors library is missing ({e}); run scripts/install-deps.sh")
    sys.exit(1)

HELPER = sys.argv[1] if len(sys.argv) > 1 else None
FAILURES = []
PASSED = 0

# safetensors header dtype -> the name TensorSpec takes (torch spelling).
SPEC_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "I16": "int16",
    "U16": "uint16", "F16": "float16", "BF16": "bfloat16", "I32": "int32",
    "U32": "uint32", "F32": "float32", "F64": "float64", "I64": "int64",
    "U64": "uint64", "F4": "float4_e2m1fn_x2",
}
BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
        "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
        "F32": 32, "F64": 64, "I64": 64, "U64": 64, "F4": 4}
NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
         "U16": np.uint16, "F16": np.float16, "I32": np.int32, "U32": np.uint32,
         "F32": np.float32, "F64": np.float64, "I64": np.int64, "U64": np.uint64}


def check(cond, what):
    global PASSED
    if cond:
        PASSED += 1
    else:
        FAILURES.append(what)
        print(f"FAIL: {what}")


def helper(*args):
    out = subprocess.run([HELPER, *args], check=True, capture_output=True)
    return out.stdout


def pattern(name, dtype, nbytes):
    """The bytes the helper writes (see interop_helper.cc)."""
    s = sum(name.encode())
    data = bytes(((i * 37 + s) & 0xFF) for i in range(nbytes))
    if dtype == "BOOL":
        data = bytes(b & 1 for b in data)
    return data


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return n * BITS[dtype] // 8


def expected_tern_tensors():
    out = {f"t.{d}": (d, [3, 4]) for d in BITS}
    out["scalar"] = ("F32", [])
    out["empty"] = ("BF16", [0, 7])
    return out


def check_reference_reads(path, metadata):
    """Loads a tern-written file with the reference library, raw and via numpy."""
    with open(path, "rb") as f:
        blob = f.read()
    loaded = dict(safetensors.deserialize(blob))
    expected = expected_tern_tensors()
    check(set(loaded) == set(expected), f"{path}: tensor names {sorted(loaded)}")
    for name, (dtype, shape) in expected.items():
        if name not in loaded:
            continue
        t = loaded[name]
        check(t["dtype"] == dtype, f"{name}: dtype {t['dtype']} != {dtype}")
        check(list(t["shape"]) == shape, f"{name}: shape {t['shape']} != {shape}")
        check(bytes(t["data"]) == pattern(name, dtype, nbytes(dtype, shape)), f"{name}: bytes differ")
    with safe_open(path, framework="np") as f:
        check((f.metadata() or {}) == metadata, f"{path}: metadata {f.metadata()} != {metadata}")
        for name, (dtype, shape) in expected.items():
            if dtype not in NUMPY:
                continue  # numpy has no such dtype; checked raw above
            arr = f.get_tensor(name)
            want = np.frombuffer(pattern(name, dtype, nbytes(dtype, shape)), dtype=NUMPY[dtype]).reshape(shape)
            check(arr.dtype == want.dtype and arr.shape == want.shape and arr.tobytes() == want.tobytes(),
                  f"{name}: numpy view differs")


def test_tern_writes_reference_reads(tmp):
    path = os.path.join(tmp, "tern.safetensors")
    helper("write", path, "--metadata", "format=pt", "--metadata", "note=é \"q\" \n")
    check_reference_reads(path, {"format": "pt", "note": "é \"q\" \n"})


def test_sharded_tern_writes_reference_reads(tmp):
    path = os.path.join(tmp, "sharded")
    helper("write", path, "--shard-bytes", "64", "--metadata", "format=pt")
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        text = f.read()
    index = json.loads(text)
    check(text == json.dumps(index, indent=2, sort_keys=True) + "\n", "index is not in transformers' layout")
    expected = expected_tern_tensors()
    check(set(index["weight_map"]) == set(expected), "weight_map names")
    check(index["metadata"]["total_size"] == sum(nbytes(d, s) for d, s in expected.values()), "total_size")
    shards = sorted(set(index["weight_map"].values()))
    check(len(shards) > 1, f"expected several shards, got {shards}")
    for shard in shards:
        with safe_open(os.path.join(path, shard), framework="np") as f:
            check(f.metadata() == {"format": "pt"}, f"{shard}: metadata")
            names = set(f.keys())
        check(names == {n for n, s in index["weight_map"].items() if s == shard}, f"{shard}: keys")
        with open(os.path.join(path, shard), "rb") as f:
            for name, t in safetensors.deserialize(f.read()):
                dtype, shape = expected[name]
                check(bytes(t["data"]) == pattern(name, dtype, nbytes(dtype, shape)), f"{shard}/{name}: bytes")


def reference_specs(tensors):
    """TensorSpecs for every dtype this safetensors accepts; others skipped."""
    specs, keep = {}, []
    for name, (dtype, shape, data) in tensors.items():
        buf = np.frombuffer(data, dtype=np.uint8).copy() if data else np.zeros(1, dtype=np.uint8)
        keep.append(buf)
        spec_shape = list(shape)
        if dtype == "F4":
            spec_shape[-1] //= 2  # TensorSpec takes the packed storage shape for *_x2 dtypes
        try:
            specs[name] = safetensors.TensorSpec(dtype=SPEC_NAMES[dtype], shape=spec_shape,
                                                 data_ptr=buf.ctypes.data, data_len=len(data))
        except Exception as e:  # older safetensors: no such dtype
            print(f"SKIP {dtype}: this safetensors cannot write it ({e})")
    return specs, keep


def test_reference_writes_tern_reads(tmp):
    if not hasattr(safetensors, "TensorSpec"):
        print("SKIP reference->tern: this safetensors has no TensorSpec")
        return
    tensors = {}
    for i, (dtype, bits) in enumerate(BITS.items()):
        shape = [2, 6] if dtype != "F4" else [3, 8]
        data = bytes(((k * 11 + i * 5 + 7) & 0xFF) for k in range(nbytes(dtype, shape)))
        if dtype == "BOOL":
            data = bytes(b & 1 for b in data)
        tensors[f"w.{dtype.lower()}"] = (dtype, shape, data)
    tensors["zero"] = ("F32", [0], b"")
    tensors["scalar"] = ("F64", [], bytes(range(8)))
    specs, keep = reference_specs(tensors)
    metadata = {"format": "pt", "unicode": "ü→✓"}
    path = os.path.join(tmp, "ref.safetensors")
    safetensors.serialize_file(specs, path, metadata=metadata)
    dump = json.loads(helper("dump", path))
    check(dump["metadata"]["ref.safetensors"] == metadata, f"metadata {dump['metadata']}")
    got = {t["name"]: t for t in dump["tensors"]}
    check(set(got) == set(specs), f"names {sorted(got)} vs {sorted(specs)}")
    for name in specs:
        dtype, shape, data = tensors[name]
        t = got.get(name)
        if t is None:
            continue
        check(t["dtype"] == dtype and t["shape"] == shape, f"{name}: {t['dtype']} {t['shape']}")
        check(bytes.fromhex(t["hex"]) == data, f"{name}: bytes differ")

    # A transformers-style sharded directory written with the reference library.
    shard_dir = os.path.join(tmp, "ref_sharded")
    os.mkdir(shard_dir)
    names = sorted(specs)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for k, half in enumerate(halves):
        shard = f"model-{k + 1:05d}-of-00002.safetensors"
        safetensors.serialize_file({n: specs[n] for n in half}, os.path.join(shard_dir, shard),
                                   metadata={"format": "pt"})
        weight_map.update({n: shard for n in half})
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    dump = json.loads(helper("dump", shard_dir))
    check(dump["sharded"], "sharded directory not read as sharded")
    check(dump["files"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
          f"files {dump['files']}")
    for t in dump["tensors"]:
        check(dump["files"][t["file"]] == weight_map[t["name"]], f"{t['name']}: wrong shard")
        check(bytes.fromhex(t["hex"]) == tensors[t["name"]][2], f"{t['name']}: sharded bytes differ")
    del keep


def test_header_byte_identical(tmp):
    """In the reference writer's order, tern writes the very same bytes."""
    if not hasattr(safetensors, "TensorSpec"):
        print("SKIP byte identity: this safetensors has no TensorSpec")
        return
    path = os.path.join(tmp, "ordered.safetensors")
    helper("write", path, "--reference-order", "--metadata", "format=pt")
    expected = expected_tern_tensors()
    tensors = {n: (d, s, pattern(n, d, nbytes(d, s))) for n, (d, s) in expected.items()}
    specs, keep = reference_specs(tensors)
    if len(specs) != len(tensors):
        print("SKIP byte identity: the reference cannot write every dtype")
        return
    ref = safetensors.serialize(specs, metadata={"format": "pt"})
    with open(path, "rb") as f:
        ours = f.read()
    n = int.from_bytes(ref[:8], "little")
    check(ours[: 8 + n] == ref[: 8 + n], f"headers differ:\n ours {ours[:8 + n]!r}\n ref  {ref[:8 + n]!r}")
    check(ours == ref, "files differ")
    del keep


def test_reference_rejects_nothing_we_accept(tmp):
    """Our stricter reader and the reference agree on a malformed file."""
    path = os.path.join(tmp, "gap.safetensors")
    header = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}'
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + b"\0\0")
    r = subprocess.run([HELPER, "dump", path], capture_output=True)
    check(r.returncode != 0 and b"corrupt" in r.stderr, f"tern accepted a gap: {r.stderr!r}")
    try:
        safetensors.deserialize(open(path, "rb").read())
        check(False, "the reference accepted a gap")
    except Exception:
        check(True, "")


def main():
    if HELPER is None:
        print("usage: test_safetensors_interop.py HELPER")
        return 2
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}")
    with tempfile.TemporaryDirectory(prefix="tern_interop_") as tmp:
        for test in (test_tern_writes_reference_reads, test_sharded_tern_writes_reference_reads,
                     test_reference_writes_tern_reads, test_header_byte_identical,
                     test_reference_rejects_nothing_we_accept):
            sub = os.path.join(tmp, test.__name__)
            os.mkdir(sub)
            try:
                test(sub)
            except Exception as e:  # a crash in one check is a failure, not an abort
                FAILURES.append(f"{test.__name__}: {e!r}")
                print(f"FAIL: {test.__name__}: {e!r}")
    print(f"{PASSED} passed, {len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
