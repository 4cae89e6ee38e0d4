#!/usr/bin/env bash
# Branch next/moe-pipe-skew (= next/moe-pipe-3wg-default: three consumer warpgroups of two sets as the
# narrow tiles' default; plus the developer switch OSSRT_CUDA_MOE_PIPE_SKEW_NS, off) checked before it
# merges: the whole GPU suite (TEST_S=220: kv_fp8_model_test's 16k CPU reference needs ~200 s on an
# H100); 256-sequence steps (48-row tiles) and 512-sequence ones (64-row tiles) in the default, the
# two-warpgroup (=2) and the three-warpgroup (=3) shapes; then 1k / 8k TTFT without and with the proxy
# fence (OSSRT_CUDA_MOE_PIPE_FENCE=1) and with the warpgroups started apart. ~9 min.
# Device call from the repo root: tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/pipe_default_check.sh
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader
TEST_S=220 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
# 256 sequences take 48-row tiles (default: three warpgroups), 512 take 64-row ones (default: one set;
# =2 two warpgroups of two sets, =3 three).
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES="256 512" TRACE=0 DEADLINE_S=150 \
  VARIANTS="-|OSSRT_CUDA_MOE_PIPE_SETS=2|OSSRT_CUDA_MOE_PIPE_SETS=3|-" tools/device/kernel_trace.sh 2>&1 | grep -E "^== var|^mxfp4"
# TTFT: the default (no proxy fence), the fence, and the consumer warpgroups started apart (branch
# next/moe-pipe-skew: OSSRT_CUDA_MOE_PIPE_SKEW_NS) so that their epilogues overlap the others' MMAs.
DEADLINE_S=140 REPEATS=2 tools/device/prefill_ab.sh nofence= fence=OSSRT_CUDA_MOE_PIPE_FENCE=1 \
  skew2=OSSRT_CUDA_MOE_PIPE_SKEW_NS=2000 skew5=OSSRT_CUDA_MOE_PIPE_SKEW_NS=5000 2>&1 | grep -E "^== |^mxfp4"
