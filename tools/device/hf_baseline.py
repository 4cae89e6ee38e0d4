#!/usr/bin/env python3
"""HF transformers baseline for the CUDA benchmark table: gpt-oss-20b at its real shape with random
bf16 weights (no checkpoint exists on the device machine), eager attention, measured on the same GPU
in the same device call as ossrt. Decode tok/s at batch 1/8/64 (128-token random prompts, greedy,
KV cache) and prefill latency at 1k/8k tokens (logits of the last row only). Writes JSON.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers import GptOssConfig, GptOssForCausalLM


def gpt_oss_20b_config():
    layers = 24
    return GptOssConfig(
        num_hidden_layers=layers, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088,
        hidden_size=2880, intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8,
        sliding_window=128, rope_theta=150000.0, max_position_embeddings=131072,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": False, "original_max_position_embeddings": 4096},
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        tie_word_embeddings=False, attn_implementation="eager")


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prefill", default="1024,8192")
    ap.add_argument("--decode-steps", type=int, default=16)
    args = ap.parse_args()
    print(f"[hf] torch {torch.__version__} transformers {transformers.__version__} "
          f"{torch.cuda.get_device_name()}", flush=True)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    cfg = gpt_oss_20b_config()
    # Built straight on the GPU in bf16: initializing 21 B parameters on the CPU would take minutes.
    with torch.device("cuda"):
        model = GptOssForCausalLM._from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="eager")
    model.eval()
    print(f"[hf] model built in {time.perf_counter() - t0:.1f} s, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters", flush=True)
    result = {"engine": f"HF transformers {transformers.__version__} eager bf16", "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(), "weights": "random (HF init), real gpt-oss-20b shape",
              "prefill_ms": {}, "decode_tok_s": {}}
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.inference_mode():
        for n in [int(x) for x in args.prefill.split(",")]:
            ids = torch.randint(0, 200000, (1, n), device="cuda", generator=gen)
            times = []
            for rep in range(3):
                _, dt = timed(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))
                if rep > 0:
                    times.append(dt * 1e3)
            result["prefill_ms"][str(n)] = statistics.median(times)
            print(f"[hf] prefill {n}: {result['prefill_ms'][str(n)]:.1f} ms", flush=True)
        for b in [int(x) for x in args.batches.split(",")]:
            ids = torch.randint(0, 200000, (b, 128), device="cuda", generator=gen)
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            warmup, elapsed = 2, 0.0
            for step in range(warmup + args.decode_steps):
                out, dt = timed(lambda: model(input_ids=nxt, past_key_values=cache, use_cache=True))
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                nxt.cpu()  # the token goes back to the host each step, as in a server
                if step >= warmup:
                    elapsed += dt
            result["decode_tok_s"][str(b)] = b * args.decode_steps / elapsed
            print(f"[hf] decode batch {b}: {result['decode_tok_s'][str(b)]:.1f} tok/s", flush=True)
            del cache
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
