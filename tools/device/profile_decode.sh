#!/usr/bin/env bash
# Where a decode step's time goes, kernel by kernel: `ncu` records a few decode-only steps of
# `ossrt bench cost` (dummy weights, CUDA graphs on, caches not flushed between kernels so the
# figures are those of a real step) and tools/device/ncu_step_table.py sums them per kernel, per
# step, against the step time that bench cost measured without the profiler. Device call from the
# repo root after tools/device/cuda_pack.sh, carry [".carry/cuda"].
#
# Usage: [MODEL=gpt-oss-20b] [QUANT=mxfp4] [BATCHES="1 64"] [CONTEXT=1024] [STEPS=3]
#        [DEADLINE_S=540] tools/device/profile_decode.sh
# Output: $OUT/profile_<model>_<quant>.log (the tables), $OUT/ncu_b<batch>.csv (raw).
set -uo pipefail
MODEL=${MODEL:-gpt-oss-20b}
QUANT=${QUANT:-mxfp4}
BATCHES=${BATCHES:-1 64}
CONTEXT=${CONTEXT:-1024}
STEPS=${STEPS:-3}
DEADLINE_S=${DEADLINE_S:-540}
START=$(date +%s)
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
mkdir -p "$FINAL"
exec > >(tee -a "$FINAL/profile_${MODEL}_${QUANT}.log") 2>&1
OSSRT=$PACK/bin/ossrt
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
if [ -f "$ROOT/.carry/tokgz/tokenizer.json.gz" ]; then
  gunzip -c "$ROOT/.carry/tokgz/tokenizer.json.gz" > /tmp/tokenizer.json && export OSSRT_TOKENIZER=/tmp/tokenizer.json
fi
NCU=$(command -v ncu || find /usr/local/cuda*/bin /opt -name ncu -type f 2>/dev/null | head -1)
echo "== $MODEL $QUANT, commit $(cat "$PACK/COMMIT" | tr '\n' ' '), ncu $NCU"
left() { echo $((START + DEADLINE_S - $(date +%s))); }

for B in $BATCHES; do
  [ "$(left)" -gt 60 ] || { echo "-- batch $B skipped: no time left"; continue; }
  # Without the profiler first: the step time the table is compared against.
  COMMON=(bench cost --model "$MODEL" --load-format dummy --backend cuda --quantization "$QUANT" --no-prefill
    --contexts "$CONTEXT" --batch-sizes "$B" --repeats 1 --no-progress)
  echo "== batch $B, context $CONTEXT: bench cost without the profiler"
  timeout "$(left)" "$OSSRT" "${COMMON[@]}" --warmup-steps 5 --decode-steps 30 --result-dir /tmp/cost_b$B \
    2>&1 | grep -A2 "ITL ms"
  echo "== batch $B: ncu over decode steps 20..$((20 + STEPS - 1))"
  OSSRT_CUDA_PROFILE_DECODE_STEPS="20:$STEPS" timeout "$(left)" "$NCU" --clock-control none --cache-control none \
    --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file "$FINAL/ncu_b$B.csv" \
    "$OSSRT" "${COMMON[@]}" --warmup-steps $((20 + STEPS + 2)) --decode-steps 2 --result-dir /tmp/cost_ncu_b$B > /tmp/ncu_run_b$B.log 2>&1
  echo "   ncu exit $?"; tail -3 /tmp/ncu_run_b$B.log
  python3 "$ROOT/tools/device/ncu_step_table.py" "$FINAL/ncu_b$B.csv" --steps "$STEPS" --title "batch $B context $CONTEXT"
done
echo "== done after $(( $(date +%s) - START )) s"
