"""tern's quantized serve views in the real engine: vLLM 0.32's CPU build
loads `tern cast` output and serves what tern's reference says it holds.

Usage: test_vllm.py TERN [FORMAT...]   (run by the engine venv's python;
tests/engine/run.sh finds it). Exit status 0 only if every check passed.

For each format vLLM's CPU build loads, one engine (in-process, one start per
format; weights are swapped with vLLM's own reload_weights, as an RL
rollout engine does):
  * step 0, `tern cast` of a tiny Llama: greedy tokens and top logprobs agree
    with a reference forward pass (transformers, FP32) of tern's weights
    dequantized from the spec (engine_model.py); for NVFP4, vLLM's own
    dequantized weights (fused q/k/v and gate/up, and unfused o/down) equal
    tern's reference bit for bit;
  * deliberately broken files (reversed nibbles, zero point +1, reciprocal
    scale, ...) reloaded into the same engine must FAIL those checks;
  * step 1 cast with --previous step 0 (band scale policy), shipped as a
    patch (`tern diff`, `tern apply` onto step 0) and reloaded: same checks.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "plugin"))  # NVFP4 emulation on CPU (see the plugin)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.join(HERE, "plugin"), HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p])
# One process: the engine core runs in this process, so apply_model sees the
# model and a timeout here stops everything.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The int4 path with int8 activations (AMX only) would quantize activations;
# the reference does not.
os.environ.setdefault("VLLM_CPU_INT4_W4A8", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import engine_model as em  # noqa: E402

# Agreement with the FP32 reference. vLLM computes in BF16, so near-ties may
# flip: a token counts as agreeing if the reference ranks it within GAP_TOL
# nats of its best. Measured on good files (docs/quantization.md): gaps and
# logprob differences stay below ~0.05; broken files miss by > 1.
GAP_TOL = 0.15
LOGPROB_TOL = 0.15
# FP8 W8A8: vLLM quantizes activations to E4M3 per token (config:
# input_activations dynamic, strategy token), the FP32 reference does not;
# measured up to 0.33 / 0.42 on good files, > 3.8 on broken ones. Its
# weights are compared bit for bit as well.
W8A8_TOL = 0.6
ENGINE_SECONDS_MAX = 420  # per format: start, every reload and check

# format -> (check, [(what is broken, tamper function, tensor suffix)])
# "generate": tokens and logprobs; "weights": vLLM's dequantized weights, bit
# for bit ("weights+generate": both).
NIBBLES = ("reversed nibbles", em.reverse_nibbles, ".weight_packed")
ZERO_POINT = ("zero point +1", em.zero_point_plus_one, ".weight_zero_point")
GPTQ_NIBBLES = ("reversed nibbles", em.reverse_nibbles, ".qweight")
FORMATS = {
    "int4-g32": ("generate", [NIBBLES]),
    "int4-g32-asym": ("generate", [ZERO_POINT]),
    "int4-g64": ("generate", [NIBBLES]),
    "int4-g64-asym": ("generate", [ZERO_POINT]),
    "int4-g128": ("generate", [NIBBLES]),
    "int4-g128-asym": ("generate", [ZERO_POINT, NIBBLES]),
    "gptq-int4-g32": ("generate", [GPTQ_NIBBLES]),
    "gptq-int4-g64": ("generate", [GPTQ_NIBBLES]),
    "gptq-int4-g128": ("generate", [GPTQ_NIBBLES]),
    "fp8-e4m3-channel": ("weights+generate", [("reciprocal scale", em.reciprocal_scale, ".weight_scale")]),
    # ModelOpt NVFP4 is W4A4: vLLM's emulation quantizes activations too, so
    # only its weights are compared (bit for bit).
    "nvfp4": ("weights", [("reciprocal scale_2", em.reciprocal_scale, ".weight_scale_2"),
                          ("reversed nibbles", em.reverse_nibbles, ".weight")]),
    "nvfp4-ct": ("weights+generate", [
        ("reciprocal global scale", em.reciprocal_scale, ".weight_global_scale"),
        ("reversed nibbles", em.reverse_nibbles, ".weight_packed")]),
}

# The compressed-tensors and GPTQ int4 formats run on vLLM's
# cpu_gemm_wna16 kernel, which its CPU wheel builds into _C_AVX512 only: on
# a CPU without AVX-512 (vLLM loads _C_AVX2) they cannot be served at all.
# There the engine part of those formats is skipped, saying so; tern's part
# (cast, diff, apply, byte for byte) still runs.
NEEDS_WNA16 = {f for f in FORMATS if "int4" in f}

failures = []
skipped = []


def wna16_missing():
    """Why vLLM cannot run its int4 kernel on this machine, or None."""
    import vllm._custom_ops  # noqa: F401  loads vllm._C_AVX2 or _C_AVX512 as torch.ops._C
    if hasattr(torch.ops._C, "cpu_gemm_wna16"):
        return None
    return ("vLLM's CPU build has no cpu_gemm_wna16 on this CPU (AVX-512: %s; its int4 kernels "
            "are built for AVX-512 only)" % ("yes" if torch.cpu._is_avx512_supported() else "no"))


def check(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


class Timeout(Exception):
    pass


def on_alarm(signum, frame):
    raise Timeout(f"over {ENGINE_SECONDS_MAX} s")


# --- what vLLM holds ------------------------------------------------------------

def vllm_weights(model):
    """Runs inside vLLM (apply_model): every NVFP4 or FP8 linear as vLLM
    holds it after loading (fused, scales processed), dequantized to FP32:
    NVFP4 with vLLM's own dequantize_to_dtype, FP8 as code * scale, the
    product its scaled-mm kernels compute."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
        dequantize_to_dtype)
    out = {}
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if w is None:
            continue
        if hasattr(m, "weight_global_scale"):
            out[name] = dequantize_to_dtype(w.data.view(torch.uint8), m.weight_scale.data,
                                            m.weight_global_scale, torch.float32, 16,
                                            swizzle=False).clone()
        elif w.dtype == torch.float8_e4m3fn and hasattr(m, "weight_scale"):
            s = m.weight_scale.data.to(torch.float32).reshape(-1)
            codes = w.data.to(torch.float32)
            if w.data.dim() == 2 and w.data.stride(0) == 1 and w.data.shape[1] > 1:
                codes = codes.t()  # a transposed view: the kernels take B as [in, out]
            out[name] = (codes * (s.reshape(-1, 1) if s.numel() > 1 else s)).contiguous()
    return out


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def reference_fused(state, name):
    base, leaf = name.rsplit(".", 1)
    parts = FUSED.get(leaf, (leaf,))
    return torch.cat([state[f"{base}.{p}.weight"] for p in parts])


def compare_weights(llm, fmt, cast_dir):
    """(ok, summary): vLLM's dequantized weights == tern's reference."""
    got = llm.apply_model(vllm_weights)[0]
    t = em.load_file(os.path.join(cast_dir, "model.safetensors"))
    ref = em.reference_state(fmt, cast_dir)
    if fmt == "nvfp4-ct":
        # vLLM multiplies by 1/global where compressed-tensors (and tern's
        # reference) divide: within two FP32 ulp. Bit for bit against the
        # engine's arithmetic on tern's file; the ulp bound against ours.
        eng = {}
        for k in ref:
            p = k[:-len(".weight")]
            if p + ".weight_packed" in t:
                codes = em.unpack_fp4(t[p + ".weight_packed"])
                block = t[p + ".weight_scale"].to(torch.float32) * (
                    1.0 / t[p + ".weight_global_scale"].to(torch.float32))
                eng[k] = (codes.reshape(*block.shape, 16) * block.unsqueeze(-1)).reshape(codes.shape)
            else:
                eng[k] = ref[k]
    else:
        eng = ref
    differ, ulp_max, names = 0, 0, []
    for name, w in sorted(got.items()):
        want = reference_fused(eng, name)
        ours = reference_fused(ref, name)
        if w.shape != want.shape:
            return False, f"{name}: shape {tuple(w.shape)} vs {tuple(want.shape)}"
        # Bits, except that -0 and +0 (E4M3 0x80 and 0x00: the same number to
        # every kernel) count as equal.
        bits_w = torch.where(w == 0, torch.zeros_like(w), w).view(torch.int32)
        differ += int((bits_w != torch.where(want == 0, torch.zeros_like(want), want)
                       .view(torch.int32)).sum())
        bits_ours = torch.where(ours == 0, torch.zeros_like(ours), ours).view(torch.int32)
        ulp_max = max(ulp_max, int((bits_w.long() - bits_ours.long()).abs().max()))
        names.append(name.split(".")[-1])
    fused = sorted(set(names))
    # ModelOpt: bit for bit. compressed-tensors: 1/global rounds once more
    # and the product again: at most 2 ulp (measured: 1-2).
    ulp_bound = 2 if fmt == "nvfp4-ct" else 0
    return (differ == 0 and ulp_max <= ulp_bound and len(names) > 0,
            f"{len(names)} layers ({', '.join(fused)}): {differ} elements differ from the "
            f"{'engine arithmetic on tern' + chr(39) + 's file' if fmt == 'nvfp4-ct' else 'reference'}"
            f", at most {ulp_max} FP32 ulp from tern's reference")


def compare_generation(llm, fmt, reference_dir):
    """(ok, summary): greedy tokens and top logprobs vs the FP32 reference."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    params = SamplingParams(max_tokens=em.MAX_TOKENS, temperature=0, logprobs=em.TOP_LOGPROBS,
                            detokenize=False, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in em.PROMPTS], params,
                        use_tqdm=False)
    model = em.reference_model(em.reference_state(fmt, reference_dir))
    agree = total = greedy_same = 0
    gap_max = lp_diff_max = 0.0
    for prompt, out in zip(em.PROMPTS, outs):
        tokens = list(out.outputs[0].token_ids)
        lp = em.reference_logprobs(model, prompt + tokens)
        free = list(prompt)
        for i, tok in enumerate(tokens):
            row = lp[len(prompt) - 1 + i]
            gap = float(row.max() - row[tok])
            gap_max = max(gap_max, gap)
            agree += gap <= (W8A8_TOL if fmt.startswith("fp8") else GAP_TOL)
            total += 1
            for cand, got in out.outputs[0].logprobs[i].items():
                lp_diff_max = max(lp_diff_max, abs(got.logprob - float(row[cand])))
        # Free-running greedy decoding of the reference, for the record.
        for i in range(len(tokens)):
            nxt = int(em.reference_logprobs(model, free)[-1].argmax())
            greedy_same += nxt == tokens[i]
            free.append(nxt)
    ok = agree == total and lp_diff_max <= (W8A8_TOL if fmt.startswith("fp8") else LOGPROB_TOL)
    return ok, (f"{agree}/{total} tokens agree (largest reference gap {gap_max:.3f}), "
                f"{greedy_same}/{total} equal to the reference's own greedy tokens, "
                f"top-{em.TOP_LOGPROBS} logprobs within {lp_diff_max:.3f}")


def evaluate(llm, fmt, kind, reference_dir):
    """What vLLM now holds against what tern's file at reference_dir means."""
    results = []
    if "weights" in kind:
        results.append(compare_weights(llm, fmt, reference_dir))
    if "generate" in kind:
        results.append(compare_generation(llm, fmt, reference_dir))
    return all(ok for ok, _ in results), "; ".join(s for _, s in results)


# --- one format ---------------------------------------------------------------

def steps(tern, fmt, work, m0, m1):
    """Step 0 and step 1 views, step 1 also rebuilt from step 0 + a patch."""
    v0, v1, v1p = (os.path.join(work, f"{fmt}-{s}") for s in ("step0", "step1", "step1-patched"))
    patch = os.path.join(work, f"{fmt}.patch")
    run([tern, "cast", "--format", fmt, m0, "-o", v0, "--threads", "1"])
    run([tern, "cast", "--format", fmt, m1, "-o", v1, "--previous", v0, "--threads", "1"])
    run([tern, "diff", v0, v1, "-o", patch])
    run([tern, "apply", v0, patch, "-o", v1p])
    if not os.path.exists(os.path.join(v1p, "config.json")):
        shutil.copy(os.path.join(v1, "config.json"), v1p)  # tensors travel in the patch
    def tensors(d):
        return b"".join(open(os.path.join(d, f), "rb").read()
                        for f in sorted(os.listdir(d)) if f.endswith(".safetensors"))
    check(tensors(v1) != tensors(v0), f"{fmt}: step 1 differs from step 0")
    check(tensors(v1p) == tensors(v1), f"{fmt}: step 1 rebuilt from step 0 + patch "
          f"({os.path.getsize(patch)} bytes) equals the step 1 cast byte for byte")
    return v0, v1p


def run_format(tern, fmt, work, m0, m1):
    from vllm import LLM
    kind, tampers = FORMATS[fmt]
    v0, v1p = steps(tern, fmt, work, m0, m1)
    if fmt in NEEDS_WNA16 and (why := wna16_missing()):
        print(f"SKIP: {fmt} in vLLM: {why}", flush=True)
        skipped.append(fmt)
        return
    start = time.monotonic()
    llm = LLM(model=v0, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
              max_model_len=64, max_num_seqs=4, seed=0)
    print(f"      {fmt}: vLLM loaded step 0 in {time.monotonic() - start:.0f} s", flush=True)
    try:
        ok, summary = evaluate(llm, fmt, kind, v0)
        check(ok, f"{fmt} step 0: {summary}")
        for what, fn, suffix in tampers:
            bad = os.path.join(work, f"{fmt}-bad")
            em.tampered_copy(v0, bad, lambda t: fn(t, suffix))
            llm.collective_rpc("reload_weights",
                               kwargs={"weights_path": bad, "is_checkpoint_format": True})
            ok, summary = evaluate(llm, fmt, kind, v0)
            check(not ok, f"{fmt} with {what} is caught: {summary}")
        llm.collective_rpc("reload_weights", kwargs={"weights_path": v1p, "is_checkpoint_format": True})
        ok, summary = evaluate(llm, fmt, kind, v1p)
        check(ok, f"{fmt} step 1 (patched, reloaded): {summary}")
    finally:
        del llm
    print(f"      {fmt}: {time.monotonic() - start:.0f} s", flush=True)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    tern = os.path.abspath(sys.argv[1])
    formats = sys.argv[2:] or list(FORMATS)
    for fmt in formats:
        if fmt not in FORMATS:
            print(f"unknown format {fmt}; known: {', '.join(FORMATS)}")
            return 2
    signal.signal(signal.SIGALRM, on_alarm)
    import vllm
    print(f"vLLM {vllm.__version__}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tern_engine_") as work:
        m0, m1 = os.path.join(work, "master0"), os.path.join(work, "master1")
        em.make_master(m0, seed=1)
        # An RL-sized step: every weight moves by ~1e-2 of itself, which
        # changes a few percent of the 4-bit codes.
        em.make_master(m1, seed=2, base=m0, step_scale=1e-2)
        for fmt in formats:
            signal.alarm(ENGINE_SECONDS_MAX)
            try:
                run_format(tern, fmt, work, m0, m1)
            except Exception as e:  # one format's failure must not hide the others'
                check(False, f"{fmt}: {type(e).__name__}: {e}")
            finally:
                signal.alarm(0)
    if skipped:
        print(f"SKIPPED in vLLM (tern's cast, diff and apply checked): {', '.join(skipped)}", flush=True)
    if len(skipped) == len(formats) and not failures:
        check(False, "every format asked for was skipped: nothing was served")
    print("FAILED: " + "; ".join(failures) if failures else
          "OK: vLLM serves tern's quantized views as tern's reference says" +
          (f" ({len(formats) - len(skipped)} of {len(formats)} formats; the rest above)" if skipped else ""),
          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
