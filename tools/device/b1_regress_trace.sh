#!/usr/bin/env bash
# Where did batch 1 lose ~2.5% since session 22 (docs/kernels.md, "Known limits")? The 120b `mxfp4` at
# 1k context, this build against c55e4cf's (packed as `ossrt_old` with cuda_pack.sh's EXTRA_BINARIES),
# both under the kernel tracer (what each kernel adds to a step, side by side) and untraced, alternated;
# then the 20b `mxfp4-fp8` batch-1 32k variants (attn_32k_b1_variants.sh: the attention's splits traded
# for ring depth). ~5 min on an H200.
# Device call from the repo root, the pack unpacked into .carry/cuda:
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/b1_regress_trace.sh
set -uo pipefail
OLD="OSSRT_AB_BIN=ossrt_old OSSRT_CUDA_QKV_NORM_FOLD=1 OSSRT_CUDA_FUSED_GREEDY=1 OSSRT_CUDA_GREEDY_SCREEN=1"
nvidia-smi --query-gpu=name --format=csv,noheader
MODEL=gpt-oss-120b QUANT=mxfp4 BATCHES=1 DEADLINE_S=200 VARIANTS="-|$OLD|-|$OLD" tools/device/kernel_trace.sh 2>&1 |
  grep -vE "^ +[0-9]+ " | head -120
DEADLINE_S=120 tools/device/attn_32k_b1_variants.sh
