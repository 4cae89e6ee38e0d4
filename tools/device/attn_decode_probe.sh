#!/usr/bin/env bash
# Decode attention on the H200 in one device call: the kernel alone in a chain of itself
# (attention_test's DISABLED_DecodeTiming: split sizes, split caps, rings, merge) and, through
# `ossrt bench cost` (kernel_trace.sh TRACE=0), decode steps at 1k and 32k context for each of
# VARIANTS (kernel_trace.sh's: environments separated by '|', "-" the default). Device call from the
# repo root after tools/device/cuda_pack.sh (+ kernel_trace/build.sh), the pack unpacked in .carry/cuda.
# Usage: [MODEL=gpt-oss-20b] [QUANT=mxfp4-fp8] [BATCHES=1] [CONTEXTS="1024 32768"] [VARIANTS="-|VAR=v"]
#        [TRACE=0] tools/device/attn_decode_probe.sh
set -uo pipefail
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
source "$ROOT/tools/device/pack_env.sh"
export OSSRT_SOURCE_DIR=$ROOT
echo "== decode attention probe, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
timeout 120 "$PACK/bin/attention_test" --gtest_also_run_disabled_tests --gtest_filter='*DecodeTiming*' 2>&1 |
  grep -E "decode_timing|FAILED|PASSED|Failure"
for ctx in ${CONTEXTS:-1024 32768}; do
  MODEL=${MODEL:-gpt-oss-20b} QUANT=${QUANT:-mxfp4-fp8} BATCHES=${BATCHES:-1} CONTEXT=$ctx TRACE=${TRACE:-0} \
    DEADLINE_S=${DEADLINE_S:-150} VARIANTS="${VARIANTS:--}" bash "$ROOT/tools/device/kernel_trace.sh" 2>&1 | grep -vE "^\s*$"
done
