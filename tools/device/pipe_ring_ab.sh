#!/usr/bin/env bash
# A change to the MXFP4 pipe kernels, old build against new in one call (docs/kernels.md, "The wide pipe
# at 8k, ablated"; first used for the ring depth): the pipe's bit-identity tests on the new build, one launch of each wide case's kernels
# (SKIPS: the bit-identity test's launches) under ncu in both builds' moe_mxfp4_test (old packed as moe_mxfp4_test_old through cuda_pack.sh's
# EXTRA_BINARIES), the new build's copy ablation, then prefill TTFT of both ossrt binaries interleaved.
# Device call from the repo root, pack unpacked into .carry/cuda. Usage: tools/device/pipe_ring_ab.sh
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
NCU=$(command -v ncu || find /usr/local/cuda*/bin /opt -name ncu -type f 2>/dev/null | head -1)
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== bit identity on the new build, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
timeout 150 "$PACK/bin/moe_mxfp4_test" --gtest_filter='*WgmmaPipeIsTheRing*:*Narrow*:*ThirtyTwo*:*Skewed*:*Graph*' 2>&1 |
  grep -E "^\[ +(OK|FAILED|PASSED) |Failure|[1-9][0-9]* / [0-9]+ differ|[0-9]+ / [1-9][0-9]* differ" | head -30
# The bit-identity test's pipe launches: E = 32 T = 300 (0: 64 rows, 1: 128), T = 1,024 (2, 3),
# T = 8,192 (4, 5), E = 128 T = 2,048 (6, 7).
echo "== one launch each under ncu (duration; caches flushed): old, new"
for kernel in gate_up_swiglu_wgmma_pipe down_wgmma_pipe; do
  for skip in ${SKIPS:-5 6}; do
    line="$kernel launch $skip:"
    for bin in moe_mxfp4_test_old moe_mxfp4_test; do
      d=$(timeout 60 "$NCU" --clock-control none -k "regex:$kernel" -s "$skip" -c 1 --section SpeedOfLight \
        "$PACK/bin/$bin" --gtest_filter='*WgmmaPipeIsTheRingBitForBit*' 2>&1 | grep -E '^ +Duration' | awk '{print $(NF), $(NF-1)}')
      line="$line $d"
    done
    echo "$line"
  done
done
ABLATE="0 3" CASES="gate_up_8k128:*WgmmaPipeIsTheRingBitForBit*:gate_up_swiglu_wgmma_pipe:5" \
  tools/device/moe_pipe_ablate.sh 2>&1 | tail -4
DEADLINE_S=${PREFILL_S:-150} REPEATS=3 tools/device/prefill_ab.sh old=BIN=ossrt_old new= 2>&1 | grep -vE "^\s*$" | tail -24
