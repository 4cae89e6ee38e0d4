#!/usr/bin/env bash
# A kernel timeline of decode steps on the H200 (the device machine has no nsys): `ossrt bench cost`
# (decode only, dummy weights, CUDA graphs on) under the CUPTI injection library of
# tools/device/kernel_trace/ (start and end of every kernel, PDL overlap intact), then
# tools/device/ktrace_summary.py: what each kernel adds to the step, the idle time between kernels,
# and the first kernels of a step one by one. Also the step time without the tracer, to show its cost.
# Device call from the repo root after tools/device/cuda_pack.sh and tools/device/kernel_trace/build.sh,
# carry [".carry/cuda"] (or the compressed pack unpacked first).
#
# Usage: [MODEL=gpt-oss-20b] [QUANT=mxfp4-fp8] [BATCHES="1 64"] [CONTEXT=1024] [ENVS="VAR=v ..."]
#        [VARIANTS="VAR=v ...|VAR=w ..."] [TRACE=0: step times only] [DEADLINE_S=300]
#        [BENCH_FLAGS="--kv-cache-dtype fp8": more bench cost flags, every variant]
#        [PREFILL=8192: instead of decode steps, one prompt of that many tokens alone, its forwards
#        traced as steps (bench cost --no-decode; "batch p8192")] tools/device/kernel_trace.sh
# VARIANTS: environments (ENVS each, '|' between them) traced one after another, e.g. A/B developer
# switches; "-" is the default environment; OSSRT_AB_BIN=name in one runs that binary of the pack.
# Output: $OUT/ktrace_<model>_<quant>.log (the tables),
# $OUT/ktrace_<model>_<quant>_b<batch>[_v<i>].csv.gz (raw, one per variant i >= 1).
set -uo pipefail
MODEL=${MODEL:-gpt-oss-20b}
QUANT=${QUANT:-mxfp4-fp8}
BATCHES=${BATCHES:-1 64}
CONTEXT=${CONTEXT:-1024}
DEADLINE_S=${DEADLINE_S:-300}
START=$(date +%s)
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
mkdir -p "$FINAL"
TAG=${MODEL}_${QUANT}${TAG_SUFFIX:-}  # TAG_SUFFIX: keeps the files of several runs in one call apart
exec > >(tee -a "$FINAL/ktrace_$TAG.log") 2>&1
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
[ -f "$PACK/lib/libossrt_ktrace.so" ] || { echo "!! $PACK/lib/libossrt_ktrace.so missing: tools/device/kernel_trace/build.sh"; exit 1; }
left() { echo $((START + DEADLINE_S - $(date +%s))); }
read -ra bench_flags <<< "${BENCH_FLAGS:-}"
IFS='|' read -ra variants <<< "${VARIANTS:-${ENVS:--}}"
echo "== kernel trace: $MODEL $QUANT, context $CONTEXT, ${BENCH_FLAGS:-no extra flags}, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
for vi in "${!variants[@]}"; do
  v=${variants[$vi]}
  [ "$v" = "-" ] && v=""
  read -ra extra_env <<< "$v"
  # OSSRT_AB_BIN=name in a variant runs $PACK/bin/name instead of ossrt (a second build packed with
  # cuda_pack.sh's EXTRA_BINARIES: A/B of kernels that have no switch, as decode_ab.sh).
  bin=ossrt
  for e in "${extra_env[@]}"; do case $e in OSSRT_AB_BIN=*) bin=${e#OSSRT_AB_BIN=} ;; esac; done
  suffix=""
  [ "$vi" -gt 0 ] && suffix="_v$vi"
  echo "== variant $vi: ${v:-(default)}"
for B in ${PREFILL:+p$PREFILL} ${PREFILL:-$BATCHES}; do
  [ "$(left)" -gt 40 ] || { echo "-- batch $B skipped: no time left"; continue; }
  if [ -n "${PREFILL:-}" ]; then  # one prompt of PREFILL tokens alone, 1 warm-up + 3 timed forwards
    COMMON=(bench cost --model "$MODEL" --load-format dummy --backend cuda --quantization "$QUANT" --no-decode
      --input-lens "$PREFILL" --repeats 3 --no-progress "${bench_flags[@]}")
    result_line=(grep -A3 "^Prefill:")
    steps=3
  else
    COMMON=(bench cost --model "$MODEL" --load-format dummy --backend cuda --quantization "$QUANT" --no-prefill
      --contexts "$CONTEXT" --batch-sizes "$B" --repeats 1 --no-progress --warmup-steps 5 --decode-steps 40
      "${bench_flags[@]}")
    result_line=(grep -A2 "ITL ms")
    steps=20
  fi
  echo "== batch $B: without the tracer"
  env "${extra_env[@]}" timeout "$(left)" "$PACK/bin/$bin" "${COMMON[@]}" --result-dir "/tmp/kt_plain_b$B" 2>&1 |
    "${result_line[@]}" | tail -1
  [ "${TRACE:-1}" = 0 ] && continue  # step times only
  echo "== batch $B: traced"
  csv=/tmp/ktrace_${TAG}_b$B$suffix.csv
  env "${extra_env[@]}" CUDA_INJECTION64_PATH="$PACK/lib/libossrt_ktrace.so" OSSRT_KTRACE_OUT="$csv" \
    timeout "$(left)" "$PACK/bin/$bin" "${COMMON[@]}" --result-dir "/tmp/kt_traced_b$B" 2>&1 | "${result_line[@]}" | tail -1
  python3 "$ROOT/tools/device/ktrace_summary.py" "$csv" --steps "$steps"
  gzip -c "$csv" > "$FINAL/ktrace_${TAG}_b$B$suffix.csv.gz"
done
done
echo "== done after $(( $(date +%s) - START )) s"
