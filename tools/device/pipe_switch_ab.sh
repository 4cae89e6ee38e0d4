#!/usr/bin/env bash
# A developer switch of the MXFP4 pipe kernels, off against on in one call (docs/kernels.md "The wide
# pipe at 8k, ablated", "Copies by the TMA unit"): the pipe's
# bit-identity tests (TESTS), one launch of each case's kernels under ncu both ways (the wide test's
# E = 32 T = 8,192 at 128 rows and E = 128 T = 2,048 at 64; the narrow test's 48-row two-sets gate_up),
# then 256-sequence decode steps and 1k / 8k prefill both ways, interleaved.
# Device call from the repo root, pack unpacked into .carry/cuda.
# Usage: SWITCH="OSSRT_CUDA_MOE_PIPE_TMA=0" [TESTS='*TmaToken*:*WgmmaPipeIsTheRing*:*Narrow*']
#        [AB_BATCHES="256": decode batch sizes; 384 and 512 take 64-row tiles (OSSRT_CUDA_MOE_PIPE_SETS=2)]
#        [E2E=0: tests and ncu only] tools/device/pipe_switch_ab.sh
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
NCU=$(command -v ncu || find /usr/local/cuda*/bin /opt -name ncu -type f 2>/dev/null | head -1)
SWITCH=${SWITCH:?SWITCH=VAR=value}
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== tests, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
timeout 200 "$PACK/bin/moe_mxfp4_test" --gtest_filter="${TESTS:-*TmaToken*:*WgmmaPipeIsTheRing*:*Narrow*:*ThirtyTwo*:*Graph*}" 2>&1 |
  grep -E "^\[ +(OK|FAILED|PASSED) |Failure|[1-9][0-9]* / [0-9]+ differ|[0-9]+ / [1-9][0-9]* differ" | head -30
echo "== one launch each under ncu (duration; caches flushed): off, $SWITCH"
for c in "*WgmmaPipeIsTheRingBitForBit*:gate_up_swiglu_wgmma_pipe:5" "*WgmmaPipeIsTheRingBitForBit*:down_wgmma_pipe:5" \
  "*WgmmaPipeIsTheRingBitForBit*:gate_up_swiglu_wgmma_pipe:6" "*NarrowTilesAreTheRing*:gate_up_swiglu_wgmma_pipe:3" \
  "*NarrowTilesAreTheRing*:down_wgmma_pipe:3"; do
  IFS=: read -r filter kernel skip <<< "$c"
  line="$kernel ${filter//\*/} launch $skip:"
  for v in "" "$SWITCH"; do
    d=$(env $v timeout 60 "$NCU" --clock-control none -k "regex:$kernel" -s "$skip" -c 1 --section SpeedOfLight \
      "$PACK/bin/moe_mxfp4_test" --gtest_filter="$filter" 2>&1 | grep -E '^ +Duration' | awk '{print $(NF), $(NF-1)}')
    line="$line $d"
  done
  echo "$line"
done
[ "${E2E:-1}" = 0 ] && exit 0
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES="${AB_BATCHES:-256}" TRACE=0 DEADLINE_S=150 VARIANTS="-|$SWITCH|-|$SWITCH" \
  tools/device/kernel_trace.sh 2>&1 | grep -E "^== var|^mxfp4"
DEADLINE_S=150 REPEATS=3 tools/device/prefill_ab.sh off= on="$SWITCH" 2>&1 | grep -E "^== |^mxfp4"
