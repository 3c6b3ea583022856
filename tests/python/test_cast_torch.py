"""tern's FP32 -> BF16/FP16 casts (and back) against PyTorch, bit for bit.

Usage: test_cast_torch.py PATH/TO/tern_quant_ref

Inputs: every special class (+-0, +-Inf, NaNs with assorted payloads and
signs, FP32 subnormals), every rounding boundary of both 16-bit formats (each
code's value, the exact midpoint to its successor, and one FP32 ulp either
side), and a few million random bit patterns and random normals at many
scales. The widening casts are checked on all 65536 codes.
"""
import subprocess
import sys

import numpy as np
import torch


def run_ref(tool, op, data: np.ndarray) -> bytes:
    proc = subprocess.run([tool, op], input=data.tobytes(), capture_output=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"tern_quant_ref {op} failed: {proc.stderr.decode().strip()}")
    return proc.stdout


def boundary_inputs() -> np.ndarray:
    codes = np.arange(65536, dtype=np.uint32)
    out = []
    # BF16: code c is the FP32 pattern c << 16; the midpoint to c+1 is
    # (c << 16) | 0x8000.
    bf = codes << 16
    out += [bf, bf | 0x8000, bf | 0x7FFF, bf | 0x8001, bf | 1, bf | 0xFFFF]
    # FP16: decode every code with torch, then the midpoints in float64.
    h = torch.from_numpy(codes.astype(np.uint16).view(np.int16)).view(torch.float16).float().numpy()
    h64 = h.astype(np.float64)
    finite = np.isfinite(h64[:-1]) & np.isfinite(h64[1:]) & (np.sign(h64[:-1]) == np.sign(h64[1:]))
    mids = ((h64[:-1] + h64[1:]) / 2)[finite].astype(np.float32)
    mid_bits = mids.view(np.uint32)
    out += [h.view(np.uint32), mid_bits, mid_bits - 1, mid_bits + 1]
    # FP16 overflow threshold 65520 (= 0x477FF000) and around it, both signs.
    t = np.array([0x477FF000, 0x477FEFFF, 0x477FF001, 0x477FE000, 0x47800000], dtype=np.uint32)
    out += [t, t | 0x80000000]
    return np.concatenate(out).astype(np.uint32)


def special_inputs() -> np.ndarray:
    vals = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF,
            0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x80800000]
    for sign in (0, 0x80000000):
        for payload in (1, 2, 0x1FFF, 0x2000, 0xFFFF, 0x10000, 0x3FFFFF, 0x400000, 0x400001,
                        0x7FFFFF, 0x5A5A5A):
            vals.append(sign | 0x7F800000 | payload)
    return np.array(vals, dtype=np.uint32)


def random_inputs(rng) -> np.ndarray:
    bits = rng.integers(0, 2**32, size=2_000_000, dtype=np.uint64).astype(np.uint32)
    scales = np.float32(10.0) ** rng.integers(-45, 39, size=1_000_000).astype(np.float32)
    with np.errstate(over="ignore"):  # overflow to Inf is a case we want
        normals = (rng.standard_normal(1_000_000).astype(np.float32) * scales).view(np.uint32)
    return np.concatenate([bits, normals])


def torch_cast(bits: np.ndarray, dtype) -> np.ndarray:
    t = torch.from_numpy(bits.view(np.float32).copy()).to(dtype)
    return t.view(torch.int16).numpy().view(np.uint16)


def compare(name, inputs, got, want) -> int:
    bad = np.nonzero(got != want)[0]
    if bad.size == 0:
        return 0
    for i in bad[:10]:
        print(f"{name}: input 0x{int(inputs[i]):08x}: tern 0x{int(got[i]):04x} torch 0x{int(want[i]):04x}")
    print(f"{name}: {bad.size} of {inputs.size} differ")
    return 1


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit("usage: test_cast_torch.py PATH/TO/tern_quant_ref")
    tool = sys.argv[1]
    rng = np.random.default_rng(20261129)
    inputs = np.concatenate([special_inputs(), boundary_inputs(), random_inputs(rng)])
    # Feed the specials at several alignments so the vector body and the
    # scalar tail of the casts both see them.
    inputs = np.concatenate([inputs, special_inputs()[:5], special_inputs()[3:14]])
    failures = 0
    for op, dtype in (("f32-to-bf16", torch.bfloat16), ("f32-to-f16", torch.float16)):
        got = np.frombuffer(run_ref(tool, op, inputs), dtype=np.uint16)
        want = torch_cast(inputs, dtype)
        if got.size != want.size:
            print(f"{op}: {got.size} outputs for {want.size} inputs")
            failures += 1
            continue
        failures += compare(op, inputs, got, want)
        print(f"{op}: {inputs.size} values compared")
    codes = np.arange(65536, dtype=np.uint16)
    for op, dtype in (("bf16-to-f32", torch.bfloat16), ("f16-to-f32", torch.float16)):
        got = np.frombuffer(run_ref(tool, op, codes), dtype=np.uint32)
        want = torch.from_numpy(codes.view(np.int16)).view(dtype).float().numpy().view(np.uint32)
        bad = np.nonzero(got != want)[0]
        for i in bad[:10]:
            print(f"{op}: code 0x{int(codes[i]):04x}: tern 0x{int(got[i]):08x} torch 0x{int(want[i]):08x}")
        failures += int(bad.size > 0)
        print(f"{op}: 65536 codes compared, {bad.size} differ")
    print("FAILED" if failures else "OK: bit-identical to torch", torch.__version__)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
