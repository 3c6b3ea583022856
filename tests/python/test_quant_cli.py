"""`tern cast` end to end: safetensors in, the engine's tensor names, dtypes,
shapes and config.json out; codes equal the reference arithmetic.

Usage: test_quant_cli.py PATH/TO/tern
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import f32_tensors, read_safetensors, write_safetensors  # noqa: E402
from test_quant_ml_dtypes import reference_fp8, reference_nvfp4  # noqa: E402
import ml_dtypes as md  # noqa: E402

def run(tern, *args):
    return subprocess.run([tern, *args], capture_output=True, text=True, check=False)


def main() -> int:
    tern = sys.argv[1]
    rng = np.random.default_rng(3)
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL:", what)

    master = {
        "model.layers.0.mlp.down_proj.weight": (rng.standard_normal((256, 384)) * 0.02).astype(np.float32),
        "model.layers.0.self_attn.q_proj.weight": (rng.standard_normal((64, 100)) * 0.02).astype(np.float32),
        "model.layers.0.input_layernorm.weight": np.ones(384, dtype=np.float32),
        "model.embed_tokens.weight": (rng.standard_normal((32, 384)) * 0.02).astype(np.float32),
    }
    down = master["model.layers.0.mlp.down_proj.weight"]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "master")
        os.mkdir(src)
        write_safetensors(os.path.join(src, "model.safetensors"), f32_tensors(master))
        with open(os.path.join(src, "config.json"), "w") as f:
            f.write('{"model_type": "llama", "hidden_size": 384}\n')

        # FP8 block: names, dtypes, shapes and codes.
        out = os.path.join(tmp, "fp8.safetensors")
        r = run(tern, "cast", "--format", "fp8-e4m3-block128", "--scale-policy", "fresh", src, "-o", out)
        check(r.returncode == 0, f"fp8 cast failed: {r.stderr.strip()}")
        if r.returncode == 0:
            t = read_safetensors(out)
            w = t.get("model.layers.0.mlp.down_proj.weight")
            s = t.get("model.layers.0.mlp.down_proj.weight_scale_inv")
            check(w is not None and w[0] == "F8_E4M3" and w[1] == (256, 384), "fp8 weight layout")
            check(s is not None and s[0] == "F32" and s[1] == (2, 3), "fp8 weight_scale_inv layout")
            want_q, want_s = reference_fp8(down, "block", md.float8_e4m3fn, 448.0)
            check(w is not None and np.array_equal(w[2].reshape(-1), want_q.reshape(-1)), "fp8 codes = reference")
            check(s is not None and np.array_equal(s[2].reshape(-1).view(np.uint32), want_s.reshape(-1).view(np.uint32)),
                  "fp8 scales = reference")
            check(t["model.layers.0.input_layernorm.weight"][0] == "BF16", "norm kept as BF16")
            check(t["model.embed_tokens.weight"][0] == "BF16", "embedding kept as BF16")
            check(t["model.layers.0.self_attn.q_proj.weight"][0] == "F8_E4M3", "q_proj quantized")

        # NVFP4 into a directory: config.json gains quantization_config; a
        # weight whose in-features do not divide 16 stays unquantized, said so.
        out_dir = os.path.join(tmp, "nvfp4")
        r = run(tern, "cast", "--format", "nvfp4", "--scale-policy", "fresh", src, "-o", out_dir)
        check(r.returncode == 0, f"nvfp4 cast failed: {r.stderr.strip()}")
        if r.returncode == 0:
            cfg = json.load(open(os.path.join(out_dir, "config.json")))
            check(cfg.get("model_type") == "llama" and cfg["quantization_config"]["quant_algo"] == "NVFP4",
                  "nvfp4 config.json")
            check("keeping model.layers.0.self_attn.q_proj.weight unquantized" in r.stderr, "q_proj kept, said so")
            t = read_safetensors(os.path.join(out_dir, "model.safetensors"))
            codes, scales, g = reference_nvfp4(down, ct=False)
            p = "model.layers.0.mlp.down_proj."
            check(t[p + "weight"][0] == "U8" and t[p + "weight"][1] == (256, 192), "nvfp4 weight layout")
            check(t[p + "weight_scale"][0] == "F8_E4M3" and t[p + "weight_scale"][1] == (256, 24),
                  "nvfp4 weight_scale layout")
            check(np.array_equal(t[p + "weight"][2].reshape(-1), codes.reshape(-1)), "nvfp4 codes = reference")
            check(t[p + "weight_scale_2"][1] == (1,) and t[p + "input_scale"][1] == (1,), "nvfp4 scalars")
            check(t["model.layers.0.self_attn.q_proj.weight"][0] == "BF16", "q_proj stays BF16")

        # The band policy with --previous keeps the scales of a small step.
        a = os.path.join(tmp, "int4-a.safetensors")
        b = os.path.join(tmp, "int4-b.safetensors")
        r1 = run(tern, "cast", "--format", "int4-g128", src, "-o", a)
        step = dict(master)
        step["model.layers.0.mlp.down_proj.weight"] = down + np.float32(1e-6) * rng.standard_normal(down.shape).astype(np.float32)
        src2 = os.path.join(tmp, "master2.safetensors")
        write_safetensors(src2, f32_tensors(step))
        r2 = run(tern, "cast", "--format", "int4-g128", src2, "--previous", a, "-o", b)
        check(r1.returncode == 0 and r2.returncode == 0, f"int4 casts failed: {r1.stderr}{r2.stderr}")
        if r1.returncode == 0 and r2.returncode == 0:
            ta, tb = read_safetensors(a), read_safetensors(b)
            name = "model.layers.0.mlp.down_proj.weight_scale"
            check(np.array_equal(ta[name][2], tb[name][2]), "band policy kept the int4 scales")
            check(ta["model.layers.0.mlp.down_proj.weight_packed"][0] == "I32", "int4 packed I32")

        # Bad input: unknown format, NaN in the master.
        r = run(tern, "cast", "--format", "fp9", src, "-o", os.path.join(tmp, "x.safetensors"))
        check(r.returncode != 0 and "unknown quantization format 'fp9'" in r.stderr, "unknown format error")
        bad = dict(master)
        bad["model.layers.0.mlp.down_proj.weight"] = down.copy()
        bad["model.layers.0.mlp.down_proj.weight"][3, 7] = np.nan
        src3 = os.path.join(tmp, "nan.safetensors")
        write_safetensors(src3, f32_tensors(bad))
        r = run(tern, "cast", "--format", "fp8-e4m3-channel", src3, "-o", os.path.join(tmp, "y.safetensors"))
        check(r.returncode != 0 and "NaN/Inf" in r.stderr and "element 1159" in r.stderr,
              f"NaN error: {r.stderr.strip()}")
        check(not os.path.exists(os.path.join(tmp, "y.safetensors")), "no output after an error")
    print("FAILED" if failures else "OK: tern cast writes the engine layouts")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
