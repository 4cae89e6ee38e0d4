#!/usr/bin/env bash
# Where one kernel's warps stall, instruction by instruction: `ncu` with source counters (PC sampling)
# on one launch of a test binary's kernel, then its SASS page as CSV (instructions executed and warp
# stall samples by reason for each SASS instruction), plus a summary of the hottest instructions.
# Device call from the repo root, pack unpacked into .carry/cuda.
# Usage: TEST="moe_mxfp4_test --gtest_filter=..." KERNELS='regex:...' [SKIP=0] [LABEL=x]
#        [DEADLINE_S=150] tools/device/ncu_sass.sh
# Output: $OUT/ncu_sass_<label>.csv (the SASS page), $OUT/ncu_sass_<label>.txt (sections, hot list).
set -uo pipefail
ROOT=$(pwd)
FINAL=${OUT:-/tmp/ossrt-out}
LABEL=${LABEL:-kernel}
mkdir -p "$FINAL"
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
NCU=$(command -v ncu || find /usr/local/cuda*/bin /opt -name ncu -type f 2>/dev/null | head -1)
read -ra test_cmd <<< "$TEST"
REP=/tmp/ncu_sass_$LABEL
echo "== ncu source counters: $TEST, kernels $KERNELS (skip ${SKIP:-0}), commit $(tr '\n' ' ' < "$PACK/COMMIT")"
timeout "${DEADLINE_S:-150}" "$NCU" --clock-control none --cache-control none -k "$KERNELS" -s "${SKIP:-0}" -c 1 \
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
  --section SourceCounters --section ComputeWorkloadAnalysis --import-source no -f -o "$REP" \
  "$PACK/bin/${test_cmd[0]}" "${test_cmd[@]:1}" > "/tmp/ncu_sass_$LABEL.log" 2>&1
echo "   ncu exit $?"; tail -3 "/tmp/ncu_sass_$LABEL.log"
"$NCU" -i "$REP.ncu-rep" --print-details all > "$FINAL/ncu_sass_$LABEL.txt" 2>&1
"$NCU" -i "$REP.ncu-rep" --page source --csv --print-source sass > "$FINAL/ncu_sass_$LABEL.csv" 2>&1 ||
  "$NCU" -i "$REP.ncu-rep" --page source --csv > "$FINAL/ncu_sass_$LABEL.csv" 2>&1
echo "   source page: $(wc -l < "$FINAL/ncu_sass_$LABEL.csv") lines"; head -c 600 "$FINAL/ncu_sass_$LABEL.csv"; echo
grep -iE "Duration|Issued Warp|No Eligible|Executed Ipc|Issue Slots|Pipe|Tensor|Executed Instructions|Branch Instructions|Warp Cycles" \
  "$FINAL/ncu_sass_$LABEL.txt" | head -40
python3 - "$FINAL/ncu_sass_$LABEL.csv" <<'PY' | tee -a "$FINAL/ncu_sass_$LABEL.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = next((i for i, r in enumerate(rows) if any("Source" == c or "Address" in c for c in r)), None)
if hdr is None:
    sys.exit("no SASS table found")
h = rows[hdr]
def col(name):
    return next((i for i, c in enumerate(h) if c.startswith(name)), None)
src, samp, ex = col("Source"), col("Warp Stall Sampling (All"), col("Instructions Executed")
print("columns:", " | ".join(h)[:1500])
body = [r for r in rows[hdr + 1:] if len(r) == len(h)]
def num(r, i):
    try: return float(r[i].replace(",", "")) if i is not None else 0.0
    except ValueError: return 0.0
total = sum(num(r, samp) for r in body) or 1
print(f"instructions {len(body)}, stall samples {total:.0f}")
for r in sorted(body, key=lambda r: -num(r, samp))[:45]:
    print(f"{100 * num(r, samp) / total:5.1f}%  ex {num(r, ex):>10.0f}  {r[src][:110]}")
PY
