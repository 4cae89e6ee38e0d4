#!/usr/bin/env bash
# Branch next/moe-pipe-3wg (the MXFP4 pipe without its per-chunk proxy fence, plus the three-warpgroup
# two-sets shape) checked in one call: the whole GPU suite (the narrow and 64-row bit-identity tests run
# the new shape), one launch each under ncu (the narrow test's E = 32, T = 256 case: gate_up and down at
# 48 rows, two warpgroups of two sets (launch 3) against three (launch 5), and launch 3 with the fence),
# then 1k / 8k TTFT without and with the fence and with the new shape at decode-sized tiles only (it
# never takes prefill tiles of 128 rows, so TTFT shows only the fence).
# Device call from the repo root: tar -C .carry -xJf .carry/cudaf/cuda.tar.xz && tools/device/pipe_3wg_fence_check.sh
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"
NCU=$(command -v ncu || find /usr/local/cuda*/bin /opt -name ncu -type f 2>/dev/null | head -1)
nvidia-smi --query-gpu=name --format=csv,noheader
TEST_S=150 tools/device/gpu_tests_parallel.sh 2>&1 | tail -28
grep -h "narrow tile" /tmp/gpu-tests/*moe_mxfp4* 2>/dev/null | head -30
echo "== one launch each under ncu (duration; caches flushed)"
for c in "gate_up_swiglu_wgmma_pipe:3:" "gate_up_swiglu_wgmma_pipe:5:" "gate_up_swiglu_wgmma_pipe:3:OSSRT_CUDA_MOE_PIPE_FENCE=1" \
  "down_wgmma_pipe:3:" "down_wgmma_pipe:5:"; do
  IFS=: read -r kernel skip env <<< "$c"
  d=$(env $env timeout 60 "$NCU" --clock-control none -k "regex:$kernel" -s "$skip" -c 1 --section SpeedOfLight \
    "$PACK/bin/moe_mxfp4_test" --gtest_filter='*NarrowTilesAreTheRing*' 2>&1 | grep -E '^ +Duration' | awk '{print $(NF), $(NF-1)}')
  echo "$kernel launch $skip ${env:-(default)}: $d"
done
DEADLINE_S=120 REPEATS=2 tools/device/prefill_ab.sh nofence= fence=OSSRT_CUDA_MOE_PIPE_FENCE=1 nofence2= 2>&1 | grep -E "^== |^mxfp4"
