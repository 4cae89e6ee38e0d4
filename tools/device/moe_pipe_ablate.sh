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
printf "%-16s %6s %12s %8s %8s %8s\n" case ablate duration_us dram_pct l2_pct sm_pct | tee "$FINAL/moe_pipe_ablate.txt"
for c in $CASES; do
  IFS=: read -r label filter kernel skip <<< "$c"
  for ab in ${ABLATE:-0 1 2 3 4 8 0}; do
    OSSRT_CUDA_MOE_PIPE_ABLATE=$ab timeout 90 "$NCU" --clock-control none -k "regex:$kernel" -s "$skip" -c 1 \
      --section SpeedOfLight --csv "$PACK/bin/moe_mxfp4_test" --gtest_filter="$filter" > /tmp/ablate.csv 2>/dev/null
    python3 - "$label" "$ab" <<'PY' | tee -a "$FINAL/moe_pipe_ablate.txt"
import csv, sys
rows = [r for r in csv.reader(open("/tmp/ablate.csv", errors="replace")) if len(r) > 10]
m = {}
for r in rows[1:]:
    m[r[-3]] = (r[-2], r[-1])
def get(name, scale=1.0):
    v = m.get(name)
    if not v: return float("nan")
    x = float(v[1].replace(",", ""))
    return x * (1000.0 if v[0] in ("ms", "msecond") else 1.0) * scale
print(f"{sys.argv[1]:16s} {sys.argv[2]:>6s} {get('Duration'):12.1f} {get('DRAM Throughput'):8.1f} {get('L2 Cache Throughput'):8.1f} {get('Compute (SM) Throughput'):8.1f}")
PY
  done
done
