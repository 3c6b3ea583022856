"""tern's small-float codecs and quantizers against ml_dtypes, bit for bit.

Usage: test_quant_ml_dtypes.py PATH/TO/tern_quant_ref

* FP8 E4M3FN / E5M2 encode (non-saturating, as ml_dtypes and PyTorch cast),
  FP4 E2M1 encode (saturating), and decode of every code incl. E8M0.
  (Debian's PyTorch 1.13 has no float8 dtypes; ml_dtypes is the oracle.)
* The FP8 quantizers (tensor, channel, 128x128 block) against an independent
  numpy implementation of the DeepSeek-V3 / vLLM arithmetic:
  s = amax / 448 in float32, codes = clip(x / s, -448, 448) cast to E4M3.
* The FP4 and INT4 quantizers against numpy re-implementations of the
  ModelOpt / compressed-tensors / OCP MX / GPTQ arithmetic.
"""
import subprocess
import sys

import ml_dtypes as md
import numpy as np


def run_ref(tool, args, data: bytes) -> bytes:
    proc = subprocess.run([tool, *args], input=data, capture_output=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"tern_quant_ref {' '.join(args)} failed: {proc.stderr.decode().strip()}")
    return proc.stdout


def parse_tensors(blob: bytes) -> dict:
    out, pos = {}, 0
    while pos < len(blob):
        end = blob.index(b"\n", pos)
        suffix, dtype, dims, nbytes = blob[pos:end].decode().split(" ")
        nbytes = int(nbytes)
        data = blob[end + 1:end + 1 + nbytes]
        out[suffix] = (dtype, tuple(int(d) for d in dims.split(",")), data)
        pos = end + 1 + nbytes
    return out


def float_inputs(rng) -> np.ndarray:
    specials = np.array([0x0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001,
                         0x00000001, 0x7F7FFFFF], dtype=np.uint32).view(np.float32)
    # Every code of every format, and midpoints between neighbours +- 1 ulp.
    grids = []
    for dt in (md.float8_e4m3fn, md.float8_e5m2):
        v = np.arange(256, dtype=np.uint8).view(dt).astype(np.float32)
        v = np.sort(v[np.isfinite(v)])
        mids = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)
        grids += [v, mids, np.nextafter(mids, np.float32(np.inf)),
                  np.nextafter(mids, np.float32(-np.inf))]
    v = np.arange(16, dtype=np.uint8).view(md.float4_e2m1fn).astype(np.float32)
    v = np.sort(v)
    mids = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    grids += [v, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))]
    # Overflow thresholds and beyond, then random values at many scales.
    grids.append(np.array([448, 464, 464.0001, 480, 500, 57344, 61440, 61441, 1e6, 6, 7, 8, 100],
                          dtype=np.float32))
    grids.append(-grids[-1])
    rand = rng.standard_normal(500_000).astype(np.float32) * (
        np.float32(2.0) ** rng.integers(-30, 20, size=500_000).astype(np.float32))
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([specials, *grids, rand, bits]).astype(np.float32)


def check_casts(tool, rng) -> int:
    failures = 0
    x = float_inputs(rng)
    for op, dt, skip_nan in (("f32-to-e4m3", md.float8_e4m3fn, False),
                             ("f32-to-e5m2", md.float8_e5m2, False),
                             ("f32-to-e2m1", md.float4_e2m1fn, True)):
        xs = x[~np.isnan(x)] if skip_nan else x  # FP4 has no NaN; quantizers reject NaN
        got = np.frombuffer(run_ref(tool, [op], xs.tobytes()), dtype=np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/overflow are cases here
            want = xs.astype(dt).view(np.uint8)
        bad = np.nonzero(got != want)[0]
        for i in bad[:8]:
            print(f"{op}: {xs[i]!r} (0x{xs[i:i+1].view(np.uint32)[0]:08x}): tern 0x{got[i]:02x} "
                  f"ml_dtypes 0x{want[i]:02x}")
        print(f"{op}: {xs.size} values, {bad.size} differ")
        failures += int(bad.size > 0)
    for op, dt, n in (("e4m3-to-f32", md.float8_e4m3fn, 256), ("e5m2-to-f32", md.float8_e5m2, 256),
                      ("e2m1-to-f32", md.float4_e2m1fn, 16), ("e8m0-to-f32", md.float8_e8m0fnu, 256)):
        codes = np.arange(n, dtype=np.uint8)
        got = np.frombuffer(run_ref(tool, [op], codes.tobytes()), dtype=np.float32)
        want = codes.view(dt).astype(np.float32)
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        print(f"{op}: {n} codes, {int((~same).sum())} differ")
        failures += int(not same.all())
    return failures


def reference_fp8(w: np.ndarray, scheme: str, dt, qmax: float):
    """The DeepSeek-V3 / vLLM arithmetic, written independently in numpy."""
    out_dim, in_dim = w.shape
    if scheme == "tensor":
        scale = (np.abs(w).max() / np.float32(qmax)).astype(np.float32).reshape(1)
        full = np.broadcast_to(scale, w.shape)
    elif scheme == "channel":
        scale = (np.abs(w).max(axis=1) / np.float32(qmax)).astype(np.float32).reshape(out_dim, 1)
        full = np.broadcast_to(scale, w.shape)
    else:
        bo, bi = -(-out_dim // 128), -(-in_dim // 128)
        scale = np.zeros((bo, bi), dtype=np.float32)
        for r in range(bo):
            for c in range(bi):
                scale[r, c] = np.abs(w[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128]).max() / np.float32(qmax)
        full = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:out_dim, :in_dim]
    q = np.clip(w / full, -qmax, qmax).astype(np.float32).astype(dt)
    return q.view(np.uint8), scale


def check_fp8_quantizers(tool, rng) -> int:
    failures = 0
    for fmt, scheme, dt, qmax, scale_name in (
            ("fp8-e4m3-block128", "block", md.float8_e4m3fn, 448.0, ".weight_scale_inv"),
            ("fp8-e4m3-tensor", "tensor", md.float8_e4m3fn, 448.0, ".weight_scale"),
            ("fp8-e4m3-channel", "channel", md.float8_e4m3fn, 448.0, ".weight_scale"),
            ("fp8-e5m2-tensor", "tensor", md.float8_e5m2, 57344.0, ".weight_scale")):
        for shape in ((300, 200), (128, 256), (7, 1000)):
            w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
            w[0, 0] = 0.5  # an outlier so blocks differ
            t = parse_tensors(run_ref(tool, ["quantize", fmt, *map(str, shape)], w.tobytes()))
            want_q, want_s = reference_fp8(w, scheme, dt, qmax)
            got_q = np.frombuffer(t[".weight"][2], dtype=np.uint8).reshape(shape)
            got_s = np.frombuffer(t[scale_name][2], dtype=np.float32).reshape(t[scale_name][1])
            ok = (t[scale_name][1] == want_s.shape and np.array_equal(got_s.view(np.uint32), want_s.view(np.uint32))
                  and np.array_equal(got_q, want_q))
            if not ok:
                print(f"{fmt} {shape}: scales {t[scale_name][1]} vs {want_s.shape}, "
                      f"{int((got_q != want_q).sum())} codes differ")
            failures += int(not ok)
        print(f"{fmt}: codes and scales match the reference arithmetic")
    return failures


def e2m1(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float32).astype(md.float4_e2m1fn).view(np.uint8) & 0xF


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    flat = codes.reshape(-1)
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def reference_nvfp4(w: np.ndarray, ct: bool):
    """ModelOpt / compressed-tensors NVFP4 arithmetic in float32 numpy."""
    f = np.float32
    amax = np.abs(w).max()
    blocks = w.reshape(-1, 16)
    bmax = np.abs(blocks).max(axis=1)
    if ct:
        g = f(6 * 448) / amax
        want = g * (bmax / f(6))
    else:
        g = amax / f(6 * 448)
        want = (bmax / f(6)) / g
    scale = want.astype(np.float32).astype(md.float8_e4m3fn)
    s32 = scale.astype(np.float32)
    eff = s32 / g if ct else s32 * g
    codes = e2m1(blocks / eff[:, None])
    return pack_nibbles(codes), scale.view(np.uint8), np.array([g], dtype=np.float32)


def reference_mxfp4(w: np.ndarray):
    """OCP MX v1.0: X = 2^(floor(log2(amax)) - emax_elem), emax_elem = 2."""
    blocks = w.reshape(-1, 32)
    bmax = np.abs(blocks).max(axis=1)
    _, e = np.frexp(bmax)
    exp = (e - 1 - 2).astype(np.int32)
    codes = e2m1(blocks / np.ldexp(np.float32(1), exp)[:, None].astype(np.float32))
    return pack_nibbles(codes), (exp + 127).astype(np.uint8)


def check_fp4_quantizers(tool, rng) -> int:
    failures = 0
    for shape in ((64, 256), (3, 96, 64), (1, 32)):
        w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        w.reshape(-1)[5] = 0.7  # an outlier block
        w2 = w.reshape(-1, shape[-1])
        for fmt in ("nvfp4", "nvfp4-ct"):
            ct = fmt == "nvfp4-ct"
            t = parse_tensors(run_ref(tool, ["quantize", fmt, *map(str, shape)], w.tobytes()))
            codes, scales, g = reference_nvfp4(w2, ct)
            names = (".weight_packed", ".weight_scale", ".weight_global_scale") if ct else \
                (".weight", ".weight_scale", ".weight_scale_2")
            ok = (t[names[0]][0] == "U8" and t[names[0]][1] == (*shape[:-1], shape[-1] // 2)
                  and t[names[1]][0] == "F8_E4M3" and t[names[1]][1] == (*shape[:-1], shape[-1] // 16)
                  and t[names[2]][1] == (1,)
                  and np.array_equal(np.frombuffer(t[names[0]][2], np.uint8), codes)
                  and np.array_equal(np.frombuffer(t[names[1]][2], np.uint8), scales)
                  and np.array_equal(np.frombuffer(t[names[2]][2], np.uint32), g.view(np.uint32)))
            if not ct:
                ok = ok and t[".input_scale"][1] == (1,)
            if not ok:
                got = np.frombuffer(t[names[0]][2], np.uint8)
                print(f"{fmt} {shape}: layout/values differ; "
                      f"{int((got != codes).sum()) if got.size == codes.size else 'size'} code bytes")
            failures += int(not ok)
        t = parse_tensors(run_ref(tool, ["quantize", "mxfp4", *map(str, shape)], w.tobytes()))
        codes, scales = reference_mxfp4(w2)
        ok = (t["_blocks"][1] == (*shape[:-1], shape[-1] // 32, 16)
              and t["_scales"][1] == (*shape[:-1], shape[-1] // 32)
              and np.array_equal(np.frombuffer(t["_blocks"][2], np.uint8), codes)
              and np.array_equal(np.frombuffer(t["_scales"][2], np.uint8), scales))
        if not ok:
            print(f"mxfp4 {shape}: layout/values differ")
        failures += int(not ok)
    print("nvfp4, nvfp4-ct, mxfp4: codes and scales match the reference arithmetic"
          if not failures else "fp4 quantizers differ")
    return failures


def pack8(nibbles: np.ndarray, axis: int) -> np.ndarray:
    """Eight 4-bit values per uint32 along `axis`, element j at bits 4*(j%8)."""
    n = np.moveaxis(nibbles.astype(np.uint32), axis, -1)
    n = n.reshape(*n.shape[:-1], -1, 8)
    words = np.zeros(n.shape[:-1], dtype=np.uint32)
    for j in range(8):
        words |= n[..., j] << np.uint32(4 * j)
    return np.moveaxis(words, -1, axis)


def reference_int4(w: np.ndarray, group: int, sym: bool, gptq: bool):
    """compressed-tensors / GPTQ arithmetic in float32 numpy."""
    f = np.float32
    out_dim, in_dim = w.shape
    grp = w.reshape(out_dim, in_dim // group, group)
    lo = np.minimum(grp.min(axis=2), 0).astype(f)
    hi = np.maximum(grp.max(axis=2), 0).astype(f)
    if sym:
        s = np.maximum(-lo, hi) / f(7.5)
        if not gptq:
            s = np.maximum(s, np.finfo(f).eps)
    else:
        s = np.maximum((hi - lo) / f(15), np.finfo(f).eps)
    s = s.astype(np.float16 if gptq else md.bfloat16)
    s32 = s.astype(f)
    zp = np.zeros_like(s32) if sym else np.clip(f(-8) - np.round(lo / s32), -8, 7)
    q = np.clip(np.round(grp / s32[:, :, None]) + zp[:, :, None], -8, 7).reshape(out_dim, in_dim)
    nib = (q + 8).astype(np.uint32)
    if gptq:
        return {".qweight": pack8(nib.T, 0), ".scales": np.ascontiguousarray(s.T).view(np.uint16),
                ".qzeros": np.full((in_dim // group, out_dim // 8), 0x77777777, dtype=np.uint32),
                ".g_idx": (np.arange(in_dim) // group).astype(np.int32)}
    res = {".weight_packed": pack8(nib, 1), ".weight_scale": s.view(np.uint16),
           ".weight_shape": np.array([out_dim, in_dim], dtype=np.int64)}
    if not sym:
        zp_nib = (zp + 8).astype(np.uint32)
        pad = (-out_dim) % 8
        zp_nib = np.pad(zp_nib, ((0, pad), (0, 0)))
        res[".weight_zero_point"] = pack8(zp_nib, 0)
    return res


def check_int4_quantizers(tool, rng) -> int:
    failures = 0
    for fmt, group, sym, gptq in (("int4-g128", 128, True, False), ("int4-g32-asym", 32, False, False),
                                  ("int4-g64", 64, True, False), ("int4-g128-asym", 128, False, False),
                                  ("gptq-int4-g128", 128, True, True), ("gptq-int4-g32", 32, True, True)):
        for shape in ((24, 256), (13, 384)):
            if gptq and shape[0] % 8:
                continue
            w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
            w[1, :group] += 0.05  # a group that is all positive (asymmetric zero point)
            t = parse_tensors(run_ref(tool, ["quantize", fmt, *map(str, shape)], w.tobytes()))
            want = reference_int4(w, group, sym, gptq)
            for name, arr in want.items():
                got = np.frombuffer(t[name][2], dtype=arr.dtype) if name in t else None
                if got is None or t[name][1] != arr.shape or not np.array_equal(got, arr.reshape(-1)):
                    print(f"{fmt} {shape}: tensor {name} differs "
                          f"(shape {t[name][1] if name in t else None} vs {arr.shape})")
                    failures += 1
    print("int4 (compressed-tensors, GPTQ): packed codes, scales and zeros match the reference"
          if not failures else "int4 quantizers differ")
    return failures


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit("usage: test_quant_ml_dtypes.py PATH/TO/tern_quant_ref")
    tool = sys.argv[1]
    rng = np.random.default_rng(20261129)
    failures = check_casts(tool, rng) + check_fp8_quantizers(tool, rng)
    failures += check_fp4_quantizers(tool, rng) + check_int4_quantizers(tool, rng)
    print("FAILED" if failures else f"OK: bit-identical to ml_dtypes {md.__version__}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
