#!/usr/bin/env python3
"""An independent simulation of ossrt's FP8 weight formats (issue 15, docs/quantization.md) in plain
PyTorch, on the golden fixtures of tests/golden/: the expected logits of `--backend cpu --quantization
fp8` (and `mxfp4-fp8` on MXFP4 checkpoints), checked by tests/unit/golden_fp8_test.cpp.

The scheme, written here from the issue's text and nothing of ossrt's C++:
  - weights: each checkpoint tensor (q, k and v separately, o, each expert's gate_up [2I, H] and down
    [H, I] in the [out, in] orientation, lm_head) cut into 128x128 blocks from row 0 and column 0
    (edge blocks partial); scale = max|block| / 448 in float32; value = e4m3 round-to-nearest-even
    of w / scale (torch.float8_e4m3fn, after clamping to +-448: saturation); the GEMM sees
    float32(e4m3) * scale. A zero block has scale 0 and values 0.
  - activations: the input of each of those GEMMs (the experts' down GEMM included: the SwiGLU
    output) per token and per 128 channels from channel 0, the same rule.
  - router, embedding, norms, attention math, biases, sinks: unchanged (float32).
  - mxfp4-fp8: the same with the experts left as the checkpoint's MXFP4 values and their inputs
    unquantized.

First the unquantized forward is checked against HF's golden logits (logits.npy, max|diff| /
max|ref| < 1e-4 at every position, the golden test's bar), so the simulation itself is right; then
the quantized logits are written next to them. Runs on the CPU (float32, deterministic); torch,
safetensors and numpy only.

  device:  python3 tools/device/fp8_reference.py      (writes tests/golden/<case>/*fp8_logits.npy and
           fp8_reference.json; with $OUT set, also $OUT/fp8_reference.tgz of those files)
  here:    tar xzf <files_at>/fp8_reference.tgz -C tests/golden
"""
import argparse
import json
import os
import sys
import tarfile
import time

import numpy as np
import torch
from safetensors.torch import load_file

T0 = time.time()
E4M3_MAX = 448.0
BLOCK = 128
FP4_VALUES = [+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
HF_BAR = 1e-4  # the golden test's max|diff| / max|ref| per position
# case -> the formats simulated there (mxfp4-fp8 needs MXFP4 experts) and their file names
CASES = {
    "bf16_single": {"fp8": "fp8_logits.npy"},
    "mxfp4_sharded": {"fp8": "fp8_logits.npy", "mxfp4-fp8": "mxfp4_fp8_logits.npy"},
}


def log(msg):
    print(f"[fp8_reference {time.time() - T0:6.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------------------ the FP8 rule

def e4m3(x):
    """float32 -> nearest e4m3 value (ties to even), saturating at +-448, back as float32."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def quantize_blocks(w):
    """A [rows, cols] float32 matrix by 128x128 blocks; returns what the GEMM sees."""
    rows, cols = w.shape
    pr, pc = -rows % BLOCK, -cols % BLOCK
    padded = torch.nn.functional.pad(w, (0, pc, 0, pr))  # zeros change no block's max
    blocks = padded.reshape((rows + pr) // BLOCK, BLOCK, (cols + pc) // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True) / E4M3_MAX
    q = torch.where(scale == 0, torch.zeros_like(blocks), e4m3(blocks / scale) * scale)
    return q.reshape(rows + pr, cols + pc)[:rows, :cols].contiguous()


def quantize_rows(x):
    """Activations [tokens, n]: per token, per 128 channels from channel 0."""
    tokens, n = x.shape
    pn = -n % BLOCK
    groups = torch.nn.functional.pad(x, (0, pn)).reshape(tokens, (n + pn) // BLOCK, BLOCK)
    scale = groups.abs().amax(dim=2, keepdim=True) / E4M3_MAX
    q = torch.where(scale == 0, torch.zeros_like(groups), e4m3(groups / scale) * scale)
    return q.reshape(tokens, n + pn)[:, :n].contiguous()


# ------------------------------------------------------------------------------ the checkpoint

def load_tensors(case_dir):
    index = os.path.join(case_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(load_file(os.path.join(case_dir, f)))
    return tensors


def dequantize_mxfp4(blocks, scales):
    """docs/reference/SPEC.md 3.3: byte j holds element 2j (low nibble) and 2j+1 (high); scale 2^(s-127)."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    vals = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)
    vals = vals.reshape(*blocks.shape[:-1], 32) * torch.pow(2.0, scales.float() - 127.0)[..., None]
    return vals.reshape(blocks.shape[0], blocks.shape[1], -1)  # [E, out, in]


def experts_out_in(t, prefix, proj):
    """An expert projection as float32 [E, out, in] (PyTorch Linear orientation)."""
    if prefix + proj + "_blocks" in t:
        return dequantize_mxfp4(t[prefix + proj + "_blocks"], t[prefix + proj + "_scales"])
    return t[prefix + proj].float().transpose(1, 2).contiguous()  # HF saves [E, in, out]


def load_model(case_dir):
    cfg = json.load(open(os.path.join(case_dir, "config.json")))
    t = load_tensors(case_dir)
    f = lambda name: t[name].float()  # noqa: E731
    layers = []
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        layers.append({
            "attn_norm": f(p + "input_layernorm.weight"), "mlp_norm": f(p + "post_attention_layernorm.weight"),
            "q_w": f(p + "self_attn.q_proj.weight"), "q_b": f(p + "self_attn.q_proj.bias"),
            "k_w": f(p + "self_attn.k_proj.weight"), "k_b": f(p + "self_attn.k_proj.bias"),
            "v_w": f(p + "self_attn.v_proj.weight"), "v_b": f(p + "self_attn.v_proj.bias"),
            "o_w": f(p + "self_attn.o_proj.weight"), "o_b": f(p + "self_attn.o_proj.bias"),
            "sinks": f(p + "self_attn.sinks"),
            "router_w": f(p + "mlp.router.weight"), "router_b": f(p + "mlp.router.bias"),
            "gate_up_w": experts_out_in(t, p + "mlp.experts.", "gate_up_proj"),  # [E, 2I, H], gate/up interleaved
            "gate_up_b": f(p + "mlp.experts.gate_up_proj_bias"),
            "down_w": experts_out_in(t, p + "mlp.experts.", "down_proj"),  # [E, H, I]
            "down_b": f(p + "mlp.experts.down_proj_bias"),
        })
    model = {"embed": f("model.embed_tokens.weight"), "norm": f("model.norm.weight"),
             "lm_head": f("lm_head.weight"), "layers": layers}
    return cfg, model


def quantized_model(model, dense, experts):
    """A copy whose dense (q, k, v, o, lm_head) and/or expert weights are block-quantized."""
    out = dict(model)
    if dense:
        out["lm_head"] = quantize_blocks(model["lm_head"])
    out["layers"] = []
    for layer in model["layers"]:
        q = dict(layer)
        if dense:
            for name in ("q_w", "k_w", "v_w", "o_w"):  # each its own tensor, its own grid
                q[name] = quantize_blocks(layer[name])
        if experts:
            q["gate_up_w"] = torch.stack([quantize_blocks(w) for w in layer["gate_up_w"]])
            q["down_w"] = torch.stack([quantize_blocks(w) for w in layer["down_w"]])
        out["layers"].append(q)
    return out


# ------------------------------------------------------------------------------ the forward

def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    """Half-split (NeoX) rotation of x [T, heads, D]; cos/sin [T, D/2]."""
    a, b = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def attention(q, k, v, sinks, window, sm_scale):
    """q [T, Hq, D], k/v [T, Hkv, D]: causal (window > 0: keys i - j < window), sinks in the denominator."""
    T, Hq, D = q.shape
    rep = Hq // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    visible = (j <= i) & ((i - j < window) if window > 0 else torch.ones_like(j, dtype=torch.bool))
    logits = logits.masked_fill(~visible[None], float("-inf"))
    combined = torch.cat([logits, sinks[:, None, None].expand(Hq, T, 1)], dim=-1)
    combined = combined - combined.amax(dim=-1, keepdim=True)
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    return torch.einsum("hqk,khd->qhd", probs, v).reshape(T, Hq * D)


def forward(cfg, case, model, quantize_dense, quantize_experts):
    ids = torch.tensor(case["prompt_ids"], dtype=torch.long)
    T = ids.shape[0]
    H, D = cfg["hidden_size"], cfg["head_dim"]
    Hq, Hkv, k_top = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_experts_per_tok"]
    eps, limit, alpha = cfg["rms_norm_eps"], cfg["swiglu_limit"], 1.702
    act_dense = quantize_rows if quantize_dense else (lambda x: x)
    act_experts = quantize_rows if quantize_experts else (lambda x: x)
    # RoPE as HF made it for this fixture (case.json, recorded from HF's rotary embedding): float32
    # inv_freq, the angle one float32 product, cos/sin times the float32 attention scaling.
    inv_freq = torch.tensor(case["rope"]["hf_inv_freq_float32"], dtype=torch.float32)
    scaling = torch.tensor(case["rope"]["attention_scaling"], dtype=torch.float32)
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos() * scaling, angles.sin() * scaling

    x = model["embed"][ids]
    for l, w in enumerate(model["layers"]):
        h = act_dense(rmsnorm(x, w["attn_norm"], eps))
        q = (h @ w["q_w"].T + w["q_b"]).reshape(T, Hq, D)
        k = (h @ w["k_w"].T + w["k_b"]).reshape(T, Hkv, D)
        v = (h @ w["v_w"].T + w["v_b"]).reshape(T, Hkv, D)
        window = cfg["sliding_window"] if cfg["layer_types"][l] == "sliding_attention" else 0
        attn = attention(rope(q, cos, sin), rope(k, cos, sin), v, w["sinks"], window, D ** -0.5)
        x = x + act_dense(attn) @ w["o_w"].T + w["o_b"]

        h = rmsnorm(x, w["mlp_norm"], eps)
        router = h @ w["router_w"].T + w["router_b"]
        top_logits, top_ids = torch.topk(router, k_top, dim=-1)
        top_weights = torch.softmax(top_logits, dim=-1)
        hx = act_experts(h)
        moe = torch.zeros_like(x)
        for e in range(w["gate_up_w"].shape[0]):
            tokens, slots = (top_ids == e).nonzero(as_tuple=True)
            if tokens.numel() == 0:
                continue
            gate_up = hx[tokens] @ w["gate_up_w"][e].T + w["gate_up_b"][e]
            gate = gate_up[:, 0::2].clamp(max=limit)
            up = gate_up[:, 1::2].clamp(min=-limit, max=limit)
            a = gate * torch.sigmoid(alpha * gate) * (up + 1)
            y = act_experts(a) @ w["down_w"][e].T + w["down_b"][e]
            moe.index_add_(0, tokens, y * top_weights[tokens, slots][:, None])
        x = x + moe
    return act_dense(rmsnorm(x, model["norm"], eps)) @ model["lm_head"].T


def per_position(got, ref):
    """max|diff| / max|ref| and relative L2, per position."""
    diff = (got - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)
    l2 = (got - ref).norm(dim=1) / ref.norm(dim=1)
    return diff, l2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--golden", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden"))
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    log(f"torch {torch.__version__}")
    written = []
    for name in args.cases.split(","):
        case_dir = os.path.join(args.golden, name)
        case = json.load(open(os.path.join(case_dir, "case.json")))
        cfg, model = load_model(case_dir)
        with torch.no_grad():
            plain = forward(cfg, case, model, False, False)
        hf = torch.from_numpy(np.load(os.path.join(case_dir, case["logits"]))).float()
        vs_hf, _ = per_position(plain, hf)
        worst = vs_hf.max().item()
        log(f"{name}: unquantized simulation vs HF: worst max|diff|/max|ref| {worst:.3g} at position "
            f"{vs_hf.argmax().item()}, median {vs_hf.median().item():.3g}")
        if not worst < HF_BAR:
            sys.exit(f"{name}: the unquantized simulation is {worst:.3g} from HF's logits (bar {HF_BAR}): "
                     "it is wrong, so its FP8 logits would be too; nothing written")
        record = {"script": "tools/device/fp8_reference.py", "torch_version": torch.__version__,
                  "unquantized_vs_hf_worst_rel": worst, "unquantized_vs_hf_median_rel": vs_hf.median().item(),
                  "formats": {}}
        for fmt, file_name in CASES[name].items():
            q_model = quantized_model(model, dense=True, experts=fmt == "fp8")
            with torch.no_grad():
                logits = forward(cfg, case, q_model, True, fmt == "fp8")
            _, l2 = per_position(logits, plain)
            np.save(os.path.join(case_dir, file_name), logits.numpy().astype(np.float32))
            written.append(os.path.join(name, file_name))
            record["formats"][fmt] = {"logits": file_name, "shape": list(logits.shape),
                                      "rel_l2_vs_unquantized_median": l2.median().item(),
                                      "rel_l2_vs_unquantized_worst": l2.max().item()}
            log(f"{name}: {fmt}: logits moved by relative L2 {l2.median().item():.3g} (median), "
                f"{l2.max().item():.3g} (worst) from the unquantized simulation; wrote {file_name}")
        with open(os.path.join(case_dir, "fp8_reference.json"), "w") as f:
            json.dump(record, f, indent=1)
        written.append(os.path.join(name, "fp8_reference.json"))
    if os.environ.get("OUT"):
        out = os.path.join(os.environ["OUT"], "fp8_reference.tgz")
        with tarfile.open(out, "w:gz") as tar:
            for rel in written:
                tar.add(os.path.join(args.golden, rel), arcname=rel)
        log(f"packed {len(written)} files into {out}")


if __name__ == "__main__":
    main()
