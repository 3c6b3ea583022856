"""`tern cast` output loaded by the engines' own loader code.

test_quant_cli.py checks names, dtypes, shapes and codes against *our* reading
of each layout. This test hands the same files to the libraries engines use to
load them, dequantizes with their code, and checks:

  (a) their values equal our own dequantization (below, written from
      docs/quantization.md) bit for bit;
  (b) they are within the format's quantization error of the FP32 master
      (bounds derived from the master alone, so a corrupted scale cannot widen
      its own bound);
  (c) deliberately wrong conventions are caught: tampered files (swapped
      nibbles, a non-inverted global scale, a biased E8M0 scale, a reciprocal
      FP8 scale) fail (b) through the library, and a wrong convention in our
      dequantizer (swapped nibbles, zero points packed along the wrong axis)
      fails (a).

Libraries (scripts/install-deps.sh puts them into .venv):

* compressed-tensors 0.12.2, the loader behind "quant_method":
  "compressed-tensors" in transformers (CompressedTensorsHfQuantizer ->
  ModelCompressor.decompress) and the config parser of vLLM. Newer releases
  do not import on Debian's torch 1.13 (0.20.1 declares torch >= 2.10; they
  reach for torch.uint16, torch.float8_e4m3fnuz, torch._dynamo); 0.12.2
  imports once torch.compile and the float8 dtype *names* exist, so we add
  them for the import only and remove them again: a later torch.float8_e4m3fn
  raises; constants computed at import (FP8_E4M3_DATA) keep a float16
  stand-in that the dequantization paths used here do not read, and (a)
  would catch it if one did. Symmetric INT4 goes through the whole ModelCompressor.decompress path
  (config, schemes on an nn.Module tree, the library reading the safetensors
  file). Files holding F8 tensors cannot be read into torch 1.13, so for
  nvfp4-ct and FP8 we read the tensors, decode F8 to FP32 with ml_dtypes
  (exact) and hand them to the library's decompress.
* gpt-oss 0.0.9, OpenAI's reference torch loader for the MXFP4 checkpoint
  (gpt_oss.torch.weights.Checkpoint._get_mxfp4_tensor; transformers'
  convert_moe_packed_tensors is the same arithmetic). Installed with
  --ignore-requires-python: it declares Python >= 3.12, the loader module
  needs 3.10.

Not covered here (no loader that runs on torch 1.13 without a GPU):
fp8-e4m3-block128 (DeepSeek / transformers FineGrainedFP8), nvfp4 (ModelOpt),
gptq-int4-* (AutoGPTQ / GPTQModel), fp8-e5m2-* (compressed-tensors has no E5M2
weight type). See docs/quantization.md.

Usage: test_engine_loaders.py PATH/TO/tern
Exit: 0 passed; 1 a check failed; 77 no loader library installed (ctest SKIP).
"""
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import ml_dtypes as md
import numpy as np

F32 = np.float32
SKIP = 77

# safetensors, raw (our reader: dtype string, shape, numpy array).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402


def tampered(src_dir, dst_dir, name, fn):
    """A copy of a cast output directory with tensor `name` replaced by fn(array)."""
    shutil.copytree(src_dir, dst_dir)
    path = os.path.join(dst_dir, "model.safetensors")
    t = read_safetensors(path)
    dt, shape, arr = t[name]
    new = np.ascontiguousarray(fn(arr)).astype(arr.dtype)
    assert new.shape == arr.shape
    t[name] = (dt, shape, new)
    write_safetensors(path, t)
    return dst_dir


# --- our dequantization, from docs/quantization.md ---------------------------

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=F32)


def nibbles_of_bytes(b, swap=False):
    """uint8 [..., n] -> codes [..., 2n]; the even element is the low nibble."""
    lo, hi = b & 0xF, b >> 4
    if swap:
        lo, hi = hi, lo
    return np.stack([lo, hi], axis=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


def nibbles_of_words(w, axis, swap=False):
    """int32 words -> 4-bit codes along `axis`; element j at bits 4*(j%8)."""
    u = np.moveaxis(w.view(np.uint32), axis, -1)
    order = range(7, -1, -1) if swap else range(8)
    n = np.stack([(u >> np.uint32(4 * j)) & np.uint32(0xF) for j in order], axis=-1)
    return np.moveaxis(n.reshape(*u.shape[:-1], u.shape[-1] * 8).astype(np.int32), -1, axis)


def bf16_bits(x):
    return np.asarray(x, dtype=F32).astype(md.bfloat16).view(np.uint16)


def ours_nvfp4_ct(t, p, swap=False, multiply_global=False):
    packed, scale = t[p + ".weight_packed"][2], t[p + ".weight_scale"][2]
    g = t[p + ".weight_global_scale"][2]
    v = E2M1[nibbles_of_bytes(packed, swap)]
    s = scale.view(md.float8_e4m3fn).astype(F32)
    eff = s * g[0] if multiply_global else s / g[0]
    out = v.reshape(*s.shape, 16) * eff[..., None]
    return bf16_bits(out.reshape(v.shape))


def ours_int4(t, p, swap=False, zp_axis=0):
    packed, scale_bits = t[p + ".weight_packed"][2], t[p + ".weight_scale"][2]
    rows, cols = (int(x) for x in t[p + ".weight_shape"][2])
    q = nibbles_of_words(packed, 1, swap)[:, :cols] - 8
    s = scale_bits.view(md.bfloat16).astype(F32)
    group = cols // s.shape[1]
    zp = np.zeros_like(s)
    if p + ".weight_zero_point" in t:
        z = t[p + ".weight_zero_point"][2]
        zp = nibbles_of_words(z, zp_axis).astype(F32) - 8
        # packed along dim 0: [ceil(out/8)*8, in/g], padding rows dropped; a
        # wrong axis does not even give the scale's shape, so it is reflowed.
        zp = zp[:rows] if zp_axis == 0 else np.resize(zp, s.shape)
    out = (q.astype(F32) - np.repeat(zp, group, axis=1)) * np.repeat(s, group, axis=1)
    return bf16_bits(out)


def ours_mxfp4(t, p, swap=False, bias=127):
    blocks, scales = t[p + "_blocks"][2], t[p + "_scales"][2]
    v = E2M1[nibbles_of_bytes(blocks, swap)]  # [.., G, 32]
    out = v * np.ldexp(F32(1), scales.astype(np.int32) - bias).astype(F32)[..., None]
    return bf16_bits(out.reshape(*blocks.shape[:-2], -1))


def ours_fp8(t, p, reciprocal=False):
    w = t[p + ".weight"][2].view(md.float8_e4m3fn).astype(F32)
    s = t[p + ".weight_scale"][2].astype(F32)
    return (w / s if reciprocal else w * s).view(np.uint32)


# --- error bounds from the master alone --------------------------------------

HEADROOM = 1.03  # band policy's 1.01 headroom plus scale rounding up (BF16 / E4M3 steps)


def grouped(w, g):
    return w.reshape(*w.shape[:-1], w.shape[-1] // g, g)


def bound(fmt, w):
    """Largest |dequantized - master| the format allows, per element."""
    a = np.abs(w)
    if fmt == "nvfp4-ct":
        bmax = np.abs(grouped(w, 16)).max(-1, keepdims=True)
        g = F32(2688) / a.max()
        # half the widest E2M1 gap (2, between 4 and 6) times the block scale,
        # which E4M3 rounds by up to 1/16; blocks whose E4M3 scale is
        # subnormal lose up to 8 of its smallest steps.
        b = bmax / 6 * HEADROOM * (1 + 1 / 16) + 8 * 2.0 ** -9 / g
        return np.broadcast_to(b, grouped(w, 16).shape).reshape(w.shape) + a * 2.0 ** -8
    if fmt == "mxfp4":
        bmax = np.abs(grouped(w, 32)).max(-1, keepdims=True)
        _, e = np.frexp(np.maximum(bmax, np.finfo(F32).tiny))
        x = np.ldexp(F32(1), e - 3)  # 2^(floor(log2 bmax) - 2)
        b = 2 * x  # saturation above 6X (OCP MX) or half of 2X's gap after headroom
        return np.broadcast_to(b, grouped(w, 32).shape).reshape(w.shape) + a * 2.0 ** -8
    if fmt.startswith("int4"):
        group = int(fmt.split("-g")[1].split("-")[0])
        gr = grouped(w, group)
        lo = np.minimum(gr.min(-1, keepdims=True), 0)
        hi = np.maximum(gr.max(-1, keepdims=True), 0)
        step = (hi - lo) / 15 if fmt.endswith("asym") else np.maximum(-lo, hi) / 7.5
        b = step * HEADROOM / 2 + 1e-7
        return np.broadcast_to(b, gr.shape).reshape(w.shape) + a * 2.0 ** -8
    if fmt.startswith("fp8-e4m3"):
        amax = a.max(axis=-1, keepdims=True) if fmt.endswith("channel") else a.max()
        s = amax / 448 * HEADROOM
        return a * 2.0 ** -4 + s * 2.0 ** -9
    raise ValueError(fmt)


# RMS(dequantized - master) / RMS(master) must stay below these (measured on
# this master: 0.13 INT4-g128, 0.085 INT4-g32-asym, 0.096 NVFP4, 0.12 MXFP4,
# 0.026 FP8 E4M3; garbage conventions give 0.3 to 1e10).
RMSE_LIMIT = {"nvfp4-ct": 0.15, "mxfp4": 0.2, "int4": 0.2, "fp8-e4m3": 0.04}


def values(bits):
    """BF16 (uint16) or FP32 (uint32) bits -> float32 values."""
    return bits.view(md.bfloat16 if bits.dtype == np.uint16 else F32).astype(F32)


def within(fmt, master, deq):
    err = np.abs(deq.astype(np.float64) - master)
    bad = int((err > bound(fmt, master)).sum())
    rms = float(np.sqrt((err ** 2).mean() / max((master.astype(np.float64) ** 2).mean(), 1e-30)))
    limit = RMSE_LIMIT[next(k for k in RMSE_LIMIT if fmt.startswith(k))]
    return bad == 0 and np.isfinite(deq).all() and rms < limit, bad, rms


# --- the libraries -----------------------------------------------------------

@contextlib.contextmanager
def torch2_names_for_import(torch):
    """torch.compile and the float8 dtype names for the duration of an import."""
    added = []
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if not hasattr(torch, name):
            setattr(torch, name, torch.float16)
            added.append(name)
    if not hasattr(torch, "compile"):
        torch.compile = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
        added.append("compile")
    try:
        yield
    finally:
        for name in added:
            delattr(torch, name)


def import_compressed_tensors():
    import torch
    with torch2_names_for_import(torch):
        for module in ("compressed_tensors.compressors.model_compressors.model_compressor",
                       "compressed_tensors.compressors.quantized_compressors.pack_quantized",
                       "compressed_tensors.compressors.quantized_compressors.nvfp4_quantized",
                       "compressed_tensors.quantization.lifecycle.forward"):
            importlib.import_module(module)
    return importlib.import_module("compressed_tensors")


def module_tree(shapes):
    """An nn.Module tree with an nn.Linear at every dotted prefix."""
    import torch.nn as nn
    root = nn.Module()
    for prefix, (out_f, in_f) in shapes.items():
        node = root
        parts = prefix.split(".")
        for part in parts[:-1]:
            if not hasattr(node, part):
                node.add_module(part, nn.Module())
            node = getattr(node, part)
        node.add_module(parts[-1], nn.Linear(in_f, out_f, bias=False))
    return root


def torch_tensor(dt, arr):
    import torch
    if dt == "BF16":
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    if dt == "F8_E4M3":  # torch 1.13 has no float8: decoded exactly by ml_dtypes
        return torch.from_numpy(arr.view(md.float8_e4m3fn).astype(F32))
    return torch.from_numpy(arr.copy())


def as_numpy(x):
    """A dequantized torch tensor -> BF16 bits (uint16) or FP32 bits (uint32)."""
    import torch
    x = x.detach()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(np.uint16)
    assert x.dtype == torch.float32, x.dtype
    return x.numpy().view(np.uint32)


def load_compressed_tensors(out_dir, prefixes):
    """Dequantized weights per prefix, as the library loads `out_dir`."""
    import torch
    from compressed_tensors import ModelCompressor
    from compressed_tensors.compressors.quantized_compressors.pack_quantized import unpack_from_int32
    from compressed_tensors.quantization import QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.utils import patch_attr

    qcfg = json.load(open(os.path.join(out_dir, "config.json")))["quantization_config"]
    mc = ModelCompressor.from_compression_config(qcfg)
    t = read_safetensors(os.path.join(out_dir, "model.safetensors"))
    shapes = {}
    for p in prefixes:
        packed = t.get(p + ".weight_packed", t.get(p + ".weight"))[1]
        shapes[p] = tuple(int(x) for x in t[p + ".weight_shape"][2]) if p + ".weight_shape" in t else \
            (packed[0], packed[1] * 2 if qcfg["format"].startswith("nvfp4") else packed[1])
    model = module_tree(shapes)
    fmt = qcfg["format"]
    weights = mc.quantization_config.config_groups["group_0"].weights
    if fmt == "pack-quantized" and weights.symmetric:
        # The whole loader: config -> schemes on the module tree -> weights
        # read from the safetensors file -> decompressed into the modules.
        mc.decompress(out_dir, model)
        return {p: as_numpy(model.get_submodule(p).weight) for p in prefixes}
    with patch_attr(mc.quantization_config, "quantization_status", QuantizationStatus.FROZEN):
        apply_quantization_config(model, mc.quantization_config)
    names_to_scheme = {name: m.quantization_scheme for name, m in model.named_modules()
                       if getattr(m, "quantization_scheme", None) is not None}
    compressor = mc.quantization_compressor[fmt]
    state = {name: torch_tensor(dt, arr) for name, (dt, _, arr) in t.items()
             if any(name.startswith(p + ".") for p in prefixes)}
    out = {}
    try:
        for module_path, data in compressor.decompress(state, names_to_scheme=names_to_scheme):
            out[module_path] = as_numpy(data["weight"])
    except ValueError as e:
        if "packed zero points" not in str(e):
            raise
        # compressed-tensors < 0.13 stops here; 0.13+ unpacks the zero points
        # along dim 0 and dequantizes, which is what these calls do, with
        # this version's own functions.
        print(f"note: compressed-tensors refuses packed zero points ({e}); "
              "dequantizing with its unpack_from_int32(packed_dim=0) + dequantize, as 0.13+ does")
        for p in prefixes:
            shape = torch.Size(state[p + ".weight_shape"].tolist())
            scale = state[p + ".weight_scale"]
            zp = unpack_from_int32(state[p + ".weight_zero_point"], 4, (shape[0], scale.shape[-1]),
                                   packed_dim=0)
            q = unpack_from_int32(state[p + ".weight_packed"], 4, shape)
            out[p] = as_numpy(dequantize(x_q=q, scale=scale, zero_point=zp))
    return out


def load_gpt_oss(out_dir, prefixes):
    import torch
    from gpt_oss.torch.weights import Checkpoint
    ckpt = Checkpoint(out_dir, torch.device("cpu"))
    return {p: as_numpy(ckpt._get_mxfp4_tensor(p + "_blocks", p + "_scales", dtype=torch.bfloat16))
            for p in prefixes}


# --- the test ----------------------------------------------------------------

def master_weights(rng):
    def w(*shape):
        x = (rng.standard_normal(shape) * 0.02).astype(F32)
        x[..., 1, :] = 0              # an all-zero row: zero scales
        x[..., 2, :] *= F32(1e-4)     # a tiny row: subnormal E4M3 block scales
        x[..., 3, 5] = F32(0.7)       # an outlier
        return x
    return {
        "model.layers.0.mlp.down_proj.weight": w(100, 256),     # out % 8 != 0: zero-point padding
        "model.layers.0.self_attn.o_proj.weight": w(64, 384),
        "model.layers.0.mlp.experts.gate_up_proj.weight": w(4, 48, 128),  # MoE [experts, out, in]
        "model.layers.0.input_layernorm.weight": np.ones(256, dtype=F32),
    }


LINEARS = ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.o_proj"]
EXPERTS = ["model.layers.0.mlp.experts.gate_up_proj"]

# format -> (library, loader, prefixes, our dequantizer, wrong conventions)
# A wrong convention is ("file", tensor suffix, tamper) -- must fail (b) through
# the library -- or ("ours", label, kwargs) -- our dequantizer with it must
# fail (a).
CASES = {
    "nvfp4-ct": ("compressed-tensors", load_compressed_tensors, LINEARS, ours_nvfp4_ct, [
        ("file", ".weight_packed", "nibbles swapped", lambda a: (a >> 4) | (a << 4)),
        ("file", ".weight_global_scale", "global scale not inverted (ModelOpt's amax/2688)",
         lambda a: (F32(1) / a).astype(F32)),
        ("ours", "nibbles swapped", {"swap": True}),
        ("ours", "global scale multiplied", {"multiply_global": True}),
    ]),
    "int4-g128": ("compressed-tensors", load_compressed_tensors, LINEARS, ours_int4, [
        ("file", ".weight_packed", "nibble order reversed in each int32",
         lambda a: nibble_reverse(a)),
        ("ours", "nibble order reversed", {"swap": True}),
    ]),
    "int4-g32-asym": ("compressed-tensors", load_compressed_tensors, LINEARS, ours_int4, [
        ("file", ".weight_zero_point", "zero points offset by one code",
         lambda a: (a.view(np.uint32) ^ np.uint32(0x11111111)).view(np.int32)),
        ("ours", "zero points packed along dim 1", {"zp_axis": 1}),
    ]),
    "mxfp4": ("gpt-oss", load_gpt_oss, EXPERTS, ours_mxfp4, [
        ("file", "_blocks", "nibbles swapped", lambda a: (a >> 4) | (a << 4)),
        ("file", "_scales", "E8M0 bias 126", lambda a: a + 1),
        ("ours", "nibbles swapped", {"swap": True}),
        ("ours", "E8M0 bias 126", {"bias": 126}),
    ]),
    "fp8-e4m3-channel": ("compressed-tensors", load_compressed_tensors, LINEARS, ours_fp8, [
        ("file", ".weight_scale", "scale stored as its reciprocal", lambda a: (F32(1) / a).astype(F32)),
        ("ours", "scale divides", {"reciprocal": True}),
    ]),
    "fp8-e4m3-tensor": ("compressed-tensors", load_compressed_tensors, LINEARS, ours_fp8, []),
}


def nibble_reverse(a):
    u = a.view(np.uint32)
    r = np.zeros_like(u)
    for j in range(8):
        r |= ((u >> np.uint32(4 * j)) & np.uint32(0xF)) << np.uint32(4 * (7 - j))
    return r.view(np.int32)


def main() -> int:
    tern = sys.argv[1]
    rng = np.random.default_rng(11)
    failures = []

    def check(cond, what):
        print(("ok:   " if cond else "FAIL: ") + what)
        if not cond:
            failures.append(what)

    available = {}
    for lib, module, importer in (("compressed-tensors", "compressed_tensors", import_compressed_tensors),
                                  ("gpt-oss", "gpt_oss", None)):
        if importlib.util.find_spec(module) is None:
            print(f"SKIP {lib}: not installed in this interpreter ({sys.executable}); "
                  "scripts/install-deps.sh installs it")
            continue
        try:
            mod = importer() if importer else __import__(module)
            version = getattr(mod, "__version__", None)
            if version is None:
                from importlib.metadata import version as dist_version
                version = dist_version(lib)
            available[lib] = version
            print(f"{lib} {version}")
        except Exception as e:  # installed but unusable: a failure, not a skip
            check(False, f"{lib} is installed but does not import: {type(e).__name__}: {e}")
    if not available and not failures:
        print("SKIPPED: no engine loader library installed")
        return SKIP

    master = master_weights(rng)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "master")
        os.mkdir(src)
        write_safetensors(os.path.join(src, "model.safetensors"),
                          {k: ("F32", v.shape, v) for k, v in master.items()})
        with open(os.path.join(src, "config.json"), "w") as f:
            f.write('{"model_type": "llama"}\n')

        for fmt, (lib, loader, prefixes, ours, wrongs) in CASES.items():
            if lib not in available:
                print(f"SKIP {fmt}: {lib} not installed")
                continue
            out = os.path.join(tmp, fmt)
            r = subprocess.run([tern, "cast", "--format", fmt, src, "-o", out],
                               capture_output=True, text=True, check=False)
            check(r.returncode == 0, f"{fmt}: tern cast ({r.stderr.strip()})")
            if r.returncode != 0:
                continue
            t = read_safetensors(os.path.join(out, "model.safetensors"))
            if lib == "compressed-tensors":
                # Its layouts are per Linear: a fused [experts, out, in]
                # tensor would not load (see docs), so it stays BF16.
                e = EXPERTS[0]
                check(t.get(e + ".weight", ("",))[0] == "BF16"
                      and f"keeping {e}.weight unquantized" in r.stderr,
                      f"{fmt}: the 3-D experts tensor stays BF16, said so")
            if fmt == "mxfp4":
                # MXFP4 is for MoE experts only (engines serve the Linears
                # of an mxfp4 checkpoint unquantized; modules_to_not_convert).
                for lin in LINEARS:
                    check(t.get(lin + ".weight", ("",))[0] == "BF16"
                          and lin + "_blocks" not in t,
                          f"{fmt}: the 2-D {lin} stays BF16")
            try:
                got = loader(out, prefixes)
            except Exception as e:
                check(False, f"{fmt}: {lib} cannot load it: {type(e).__name__}: {e}")
                continue
            for p in prefixes:
                want, lib_bits = ours(t, p), got[p]
                same = lib_bits.shape == want.shape and np.array_equal(lib_bits, want)
                differ = int((lib_bits != want).sum()) if lib_bits.shape == want.shape else "shape"
                check(same, f"{fmt} {p}: {lib} dequantizes bit-identically to ours ({differ} differ)")
                ok, bad, rms = within(fmt, master[p + ".weight"], values(lib_bits))
                check(ok, f"{fmt} {p}: within the format's error of the master "
                          f"({bad} elements out of bound, relative RMSE {rms:.4f})")
            for kind, what, *rest in wrongs:
                p = prefixes[0]
                if kind == "file":
                    where, fn = what, rest[1]
                    label = rest[0]
                    bad_dir = tampered(out, os.path.join(tmp, f"{fmt}-bad-{len(os.listdir(tmp))}"),
                                       p + where, fn)
                    bad_bits = loader(bad_dir, prefixes)[p]
                    ok, bad, rms = within(fmt, master[p + ".weight"], values(bad_bits))
                    check(not ok, f"{fmt}: a file with {label} is caught through {lib} "
                                  f"({bad} elements out of bound, relative RMSE {rms:.3g})")
                else:
                    wrong = ours(t, p, **rest[0])
                    check(not np.array_equal(wrong, got[p]),
                          f"{fmt}: our dequantizer with {what} disagrees with {lib}")

    print("FAILED" if failures else "OK: the engines' loaders read tern cast's layouts as we do")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
