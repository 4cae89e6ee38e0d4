#!/usr/bin/env bash
# Session 35's first call, in one pack (branch next/moe-tma-no-proxy-fence's build as `ossrt`, c55e4cf's
# as `ossrt_old`; at batch 1 the MXFP4 pipe does not run, so there `ossrt` is main's decode path):
#   1. 120b `mxfp4` batch 1 at 1k, this build against the old one, alternated (issue 15's 400 floor);
#   2. 20b `mxfp4-fp8` batch 1 at 32k: default, the old build, and the attention's splits traded for ring
#      depth (attn_32k_b1_variants.sh's two one-wave variants);
#   3. the pipe without its per-chunk proxy fence against with it (OSSRT_CUDA_MOE_PIPE_FENCE=1):
#      256-sequence decode steps (interleaved twice) and 1k / 8k TTFT.
# Device call from the repo root: tar -C .carry -xJf .carry/cudaf/cuda.tar.xz && tools/device/regress_32k_fence.sh
set -uo pipefail
OLD="OSSRT_AB_BIN=ossrt_old,OSSRT_CUDA_QKV_NORM_FOLD=1,OSSRT_CUDA_FUSED_GREEDY=1,OSSRT_CUDA_GREEDY_SCREEN=1"
FENCE=OSSRT_CUDA_MOE_PIPE_FENCE=1
show() { grep -E "^==|exit|ITL|^ *mxfp4"; }
nvidia-smi --query-gpu=name --format=csv,noheader
BATCHES=1 MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=1024 DEADLINE_S=170 tools/device/decode_ab.sh new= old="$OLD" new2= old2="$OLD" 2>&1 | show
BATCHES=1 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=32768 DEADLINE_S=110 tools/device/decode_ab.sh base= old="$OLD" \
  s48r4=OSSRT_CUDA_ATTN_MAX_SPLITS=48,OSSRT_CUDA_ATTN_DECODE_RING=4 \
  s32r6=OSSRT_CUDA_ATTN_MAX_SPLITS=32,OSSRT_CUDA_ATTN_DECODE_RING=6 2>&1 | show
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES=256 TRACE=0 DEADLINE_S=150 VARIANTS="-|$FENCE|-|$FENCE" \
  tools/device/kernel_trace.sh 2>&1 | grep -E "^== var|^mxfp4"
DEADLINE_S=100 REPEATS=2 tools/device/prefill_ab.sh nofence= fence="$FENCE" 2>&1 | grep -E "^== |^mxfp4"
