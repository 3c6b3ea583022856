"""The engine tests' model side: a tiny Llama made locally, tern's reference
dequantization of each quantized layout (docs/quantization.md, written from
the spec, not from any engine's code), deliberately broken files, and a
reference forward pass.

Runs in the engine venv (scripts/install-engine-env.sh): torch 2.13 (float8
dtypes), transformers, safetensors.
"""
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

# Big enough for every group size (128) and NVFP4/MXFP4 blocks; hidden 256
# makes a wrongly quantized lm_head a size mismatch the engine refuses to load.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    # A wide initializer gives peaked next-token distributions, so a layout
    # error shows as wrong greedy tokens, not as noise in flat logprobs.
    "initializer_range": 0.08,
    "torch_dtype": "bfloat16",
}

PROMPTS = [[1, 17, 300, 42, 99], [1, 250, 7, 7, 480, 33, 5], [1, 64]]
MAX_TOKENS = 8
TOP_LOGPROBS = 5


def make_master(path, seed, base=None, step_scale=0.0):
    """Writes an FP32 master (model.safetensors + config.json) at `path`.
    With `base` (a master dir), the weights are base's plus a small RL-like
    step: step_scale * N(0, 1) * |w| on every element."""
    from transformers import LlamaConfig, LlamaForCausalLM
    os.makedirs(path, exist_ok=True)
    if base is None:
        torch.manual_seed(seed)
        cfg = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "torch_dtype"})
        model = LlamaForCausalLM(cfg).to(torch.float32)
        # transformers initialises norms to 1; perturb them so that a layer
        # read in the wrong order cannot hide behind symmetric weights.
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        for k, v in state.items():
            if "norm" in k:
                state[k] = (1.0 + 0.1 * torch.randn(v.shape)).to(torch.float32)
    else:
        g = torch.Generator().manual_seed(seed)
        state = load_file(os.path.join(base, "model.safetensors"))
        for k, v in state.items():
            state[k] = (v + step_scale * torch.randn(v.shape, generator=g) * v.abs()).contiguous()
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)


# --- tern's layouts, dequantized from the spec (docs/quantization.md) -------

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                    dtype=torch.float32)


def unpack_fp4(packed):
    """U8 [.., n/2] -> FP32 codes [.., n]; the even element in the low nibble."""
    lo = E2M1[(packed & 0xF).long()]
    hi = E2M1[(packed >> 4).long()]
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def unpack_int4(packed):
    """I32 [.., n/8] -> the 4-bit fields [.., n], element i at bits 4*(i%8)."""
    u = packed.to(torch.int64) & 0xFFFFFFFF
    fields = [(u >> (4 * j)) & 0xF for j in range(8)]
    return torch.stack(fields, dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def dequantize(fmt, t, prefix):
    """The FP32 weight tern's file `t` (name -> tensor) holds for `prefix`,
    or None when that weight is stored unquantized."""
    if prefix + ".weight" in t and t[prefix + ".weight"].dtype in (torch.bfloat16, torch.float16,
                                                                   torch.float32):
        return None
    if fmt.startswith("fp8-e4m3"):
        w = t[prefix + ".weight"].to(torch.float32)
        s = t[prefix + ".weight_scale"]
        return w * (s.reshape(-1, 1) if s.numel() > 1 else s)
    if fmt == "nvfp4":
        codes = unpack_fp4(t[prefix + ".weight"])
        block = t[prefix + ".weight_scale"].to(torch.float32) * t[prefix + ".weight_scale_2"]
        return (codes.reshape(*block.shape, 16) * block.unsqueeze(-1)).reshape(codes.shape)
    if fmt == "nvfp4-ct":
        codes = unpack_fp4(t[prefix + ".weight_packed"])
        block = t[prefix + ".weight_scale"].to(torch.float32) / t[prefix + ".weight_global_scale"]
        return (codes.reshape(*block.shape, 16) * block.unsqueeze(-1)).reshape(codes.shape)
    if fmt.startswith("int4-g"):
        g = int(fmt.split("-g")[1].split("-")[0])
        q = unpack_int4(t[prefix + ".weight_packed"]) - 8
        s = t[prefix + ".weight_scale"].to(torch.float32)
        out = q.shape[0]
        if fmt.endswith("-asym"):
            zp = unpack_int4(t[prefix + ".weight_zero_point"].t().contiguous()).t()[:out] - 8
        else:
            zp = torch.zeros_like(s, dtype=torch.int64)
        x = (q.reshape(out, -1, g) - zp.unsqueeze(-1)).to(torch.float32) * s.unsqueeze(-1)
        return x.reshape(out, -1)
    if fmt.startswith("gptq-int4-g"):
        g = int(fmt.split("-g")[1])
        q = unpack_int4(t[prefix + ".qweight"].t().contiguous()).t()  # [in, out]
        z = unpack_int4(t[prefix + ".qzeros"]) + 1                    # [in/g, out], v1 zeros
        s = t[prefix + ".scales"].to(torch.float32)                    # [in/g, out]
        gi = torch.arange(q.shape[0]) // g
        return ((q - z[gi]).to(torch.float32) * s[gi]).t().contiguous()
    raise ValueError(f"no reference dequantizer for {fmt}")


def reference_state(fmt, cast_dir):
    """FP32 state dict: tern's dequantized weights, other tensors widened."""
    t = load_file(os.path.join(cast_dir, "model.safetensors"))
    prefixes = {k.rsplit(".", 1)[0] for k in t if not k.endswith(".weight")
                or t[k].dtype not in (torch.bfloat16, torch.float16, torch.float32)}
    state = {}
    for p in sorted(prefixes):
        w = dequantize(fmt, t, p)
        if w is not None:
            state[p + ".weight"] = w
    for k, v in t.items():
        if k.endswith(".weight") and v.dtype in (torch.bfloat16, torch.float16, torch.float32):
            state[k] = v.to(torch.float32)
    return state


def reference_model(state):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "torch_dtype"})
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [m for m in missing if "rotary" not in m], (missing, unexpected)
    return model


@torch.no_grad()
def reference_logprobs(model, tokens):
    """Log-probabilities [len(tokens), vocab] of the next token after each prefix."""
    logits = model(torch.tensor([tokens])).logits[0].to(torch.float32)
    return torch.log_softmax(logits, dim=-1)


# --- deliberately broken files ------------------------------------------------

def tampered_copy(src, dst, fn):
    """A copy of cast dir `src` with fn(tensors) applied to its tensors."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    t = load_file(os.path.join(src, "model.safetensors"))
    fn(t)
    save_file(t, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def reverse_nibbles(t, suffix):
    """Packed 4-bit codes only (U8 or I32): a BF16 `.weight` that merely
    shares the suffix is left alone."""
    for k in [k for k in t if k.endswith(suffix) and t[k].dtype in (torch.uint8, torch.int32)]:
        v = t[k]
        if v.dtype == torch.uint8:
            t[k] = ((v >> 4) | (v << 4)).contiguous()
        else:  # I32: reverse the 8 nibbles of each word
            u = v.to(torch.int64) & 0xFFFFFFFF
            r = torch.zeros_like(u)
            for j in range(8):
                r |= ((u >> (4 * j)) & 0xF) << (4 * (7 - j))
            t[k] = r.to(torch.int32)  # wraps: the bit pattern is what counts


def zero_point_plus_one(t, suffix):
    for k in [k for k in t if k.endswith(suffix)]:
        u = t[k].to(torch.int64) & 0xFFFFFFFF
        # +1 in every nibble, wrapping 15 -> 0 without carrying.
        fields = [(((u >> (4 * j)) & 0xF) + 1) & 0xF for j in range(8)]
        r = torch.zeros_like(u)
        for j, f in enumerate(fields):
            r |= f << (4 * j)
        t[k] = r.to(torch.int32)


def reciprocal_scale(t, suffix):
    for k in [k for k in t if k.endswith(suffix)]:
        t[k] = (1.0 / t[k].to(torch.float32)).to(t[k].dtype)
