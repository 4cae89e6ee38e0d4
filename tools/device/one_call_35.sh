#!/usr/bin/env bash
# Session 35's device work in one call, for when only one machine comes (each failed start costs
# ~90 s of the 30 minutes): pack = branch next/moe-pipe-3wg's build as `ossrt` + c55e4cf's as `ossrt_old`.
#   1. 256-sequence decode steps: default (no proxy fence), the fence (main's kernels), three warpgroups;
#   2. the whole GPU suite (the pipe's bit-identity tests run the new three-warpgroup shape);
#   3. 120b `mxfp4` batch 1 at 1k, this build against the old (issue 15's 400 floor);
#   4. 20b `mxfp4-fp8` batch 1 at 32k: default, old, and splits traded for ring depth.
# Parts run in that order within TOTAL_S seconds (default 540); a part that would overrun is cut short.
# Device call: tar -C .carry -xJf .carry/cudaf/cuda.tar.xz && [TOTAL_S=...] tools/device/one_call_35.sh
set -uo pipefail
T0=$(date +%s)
TOTAL_S=${TOTAL_S:-540}
left() { echo $((TOTAL_S - ($(date +%s) - T0))); }
cap() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }
OLD="OSSRT_AB_BIN=ossrt_old,OSSRT_CUDA_QKV_NORM_FOLD=1,OSSRT_CUDA_FUSED_GREEDY=1,OSSRT_CUDA_GREEDY_SCREEN=1"
FENCE=OSSRT_CUDA_MOE_PIPE_FENCE=1 SETS3=OSSRT_CUDA_MOE_PIPE_SETS=3
show() { grep -E "^==|exit|ITL|^ *mxfp4"; }
nvidia-smi --query-gpu=name --format=csv,noheader
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES=256 TRACE=0 DEADLINE_S=$(cap 150) VARIANTS="-|$FENCE|$SETS3|-|$FENCE|$SETS3" \
  tools/device/kernel_trace.sh 2>&1 | grep -E "^== var|^mxfp4"
[ "$(left)" -gt 60 ] && TEST_S=$(cap 130) tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
grep -h "narrow tile" /tmp/gpu-tests/moe_mxfp4_test*.log 2>/dev/null | grep "3 set" | head -12
[ "$(left)" -gt 60 ] && BATCHES=1 MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=1024 DEADLINE_S=$(cap 100) \
  tools/device/decode_ab.sh new= old="$OLD" 2>&1 | show
[ "$(left)" -gt 40 ] && BATCHES=1 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=32768 DEADLINE_S=$(cap 100) \
  tools/device/decode_ab.sh base= old="$OLD" \
  s48r4=OSSRT_CUDA_ATTN_MAX_SPLITS=48,OSSRT_CUDA_ATTN_DECODE_RING=4 \
  s32r6=OSSRT_CUDA_ATTN_MAX_SPLITS=32,OSSRT_CUDA_ATTN_DECODE_RING=6 2>&1 | show
echo "== done after $(( $(date +%s) - T0 )) s"
