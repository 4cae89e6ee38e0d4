#!/usr/bin/env bash
# Session 35's first call, in one pack (branch next/moe-pipe-3wg's build as `ossrt` (= next/moe-tma-no-proxy-fence + a pipe shape), c55e4cf's
# as `ossrt_old`; at batch 1 the MXFP4 pipe does not run, so there `ossrt` is main's decode path):
#   1. 120b `mxfp4` batch 1 at 1k, this build against the old one, alternated (issue 15's 400 floor);
#   2. 20b `mxfp4-fp8` batch 1 at 32k: default, the old build, and the attention's splits traded for ring
#      depth (attn_32k_b1_variants.sh's two one-wave variants);
#   3. 256-sequence decode steps, interleaved twice: the pipe without its per-chunk proxy fence (the
#      branch's default), with it (OSSRT_CUDA_MOE_PIPE_FENCE=1: main's kernels), and the three-warpgroup
#      two-sets shape (OSSRT_CUDA_MOE_PIPE_SETS=3, branch next/moe-pipe-3wg).
# The pipe's tests, ncu of one launch each and TTFT are pipe_3wg_fence_check.sh's (the second call).
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
SETS3=OSSRT_CUDA_MOE_PIPE_SETS=3
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES=256 TRACE=0 DEADLINE_S=210 VARIANTS="-|$FENCE|$SETS3|-|$FENCE|$SETS3" \
  tools/device/kernel_trace.sh 2>&1 | grep -E "^== var|^mxfp4"
