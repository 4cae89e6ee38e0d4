#!/usr/bin/env bash
# What bounds the MXFP4 pipe kernels (docs/kernels.md, "The wide pipe at 8k, ablated"): one launch of
# a test's gate_up (or down) pipe kernel under ncu (duration and throughputs only) with each ablation
# of OSSRT_CUDA_MOE_PIPE_ABLATE (1 no token-tile copies, 2 no weight copies, 4 no dequantization,
# 8 no epilogue stores; sums combine them). Outputs are garbage under ablation: the tests' failures are
# expected, only the kernel's duration is read.
# Device call from the repo root, pack unpacked into .carry/cuda.
# Usage: [CASES="label:test_filter:kernel_regex:skip ..."] [ABLATE="0 1 2 3 4 8"] tools/device/moe_pipe_ablate.sh
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
NCU=$(command -v ncu || find /usr/local/cuda*/bin /opt -name ncu -type f 2>/dev/null | head -1)
FINAL=${OUT:-/tmp/ossrt-out}
mkdir -p "$FINAL"
# Default cases: the 8k prefill's 128-row gate_up and down (E = 32, T = 8,192: the test's sixth
# launch), and the decode step's 48-row two-sets gate_up (E = 32, T = 256: the narrow test's fourth).
CASES=${CASES:-"gate_up_8k128:*WgmmaPipeIsTheRingBitForBit*:gate_up_swiglu_wgmma_pipe:5 down_8k128:*WgmmaPipeIsTheRingBitForBit*:down_wgmma_pipe:5 gate_up_256x48:*NarrowTilesAreTheRing*:gate_up_swiglu_wgmma_pipe:3"}
echo "== pipe ablations, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
echo "case ablate: DRAM %, duration, L2 %, SM %" | tee "$FINAL/moe_pipe_ablate.txt"
for c in $CASES; do
  IFS=: read -r label filter kernel skip <<< "$c"
  for ab in ${ABLATE:-0 1 2 3 4 8 0}; do
    echo "$label $ab: $(OSSRT_CUDA_MOE_PIPE_ABLATE=$ab timeout 90 "$NCU" --clock-control none -k "regex:$kernel" -s "$skip" \
      -c 1 --section SpeedOfLight "$PACK/bin/moe_mxfp4_test" --gtest_filter="$filter" 2>&1 |
      grep -E '^ +(Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\))' | awk '{print $(NF-1), $NF}' |
      tr '\n' ' ')" | tee -a "$FINAL/moe_pipe_ablate.txt"
  done
done
