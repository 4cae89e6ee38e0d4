#!/usr/bin/env bash
# Diagnosis call for the whole-model CUDA failures at small widths (issue 7), run on the device by
# the `run` tool from the repo root after tools/device/cuda_pack.sh: the tiny model op by op, the
# golden fixtures, a host backtrace of any crash (gdb/cuda-gdb batch), compute-sanitizer memcheck of
# the tiny model's forward, then the quick GPU suites. Every step is time-boxed (DEADLINE_S total).
# Usage: tools/device/cuda_diag.sh   (logs and a summary under $OUT)
set -uo pipefail
DEADLINE_S=${DEADLINE_S:-450}
START=$(date +%s)
budget() {  # budget <wanted seconds> -> seconds this step may take (0 = skip)
  local left=$((START + DEADLINE_S - 10 - $(date +%s)))
  if [ "$left" -lt 10 ]; then echo 0; elif [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
WORK=/tmp/ossrt-diag
mkdir -p "$FINAL" "$WORK"
exec > >(tee -a "$FINAL/diag.log") 2>&1
export OSSRT_SOURCE_DIR=$ROOT  # tests find fixtures through it (tests/test_paths.h)
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
CUDA_BIN=$(dirname "$(find /usr/local/cuda*/bin -name compute-sanitizer 2>/dev/null | head -1)")
echo "== device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); commit $(cat "$PACK/COMMIT")"

step() {  # step <name> <wanted seconds> <command...>: runs, logs to $WORK/<name>.log, prints the telling lines
  local name=$1 secs
  secs=$(budget "$2")
  shift 2
  if [ "$secs" = 0 ]; then echo "-- $name skipped: no time left"; return; fi
  timeout "$secs" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|\[metric\]|\[act\]|Failure|rror|Invalid|ERROR SUMMARY|#[0-9]+ |SIG" \
    "$WORK/$name.log" | head -60
  echo "-- $name exit $rc ($(( $(date +%s) - START )) s)"
  if [ $rc = 139 ] || [ $rc = 134 ]; then
    echo "== host backtrace of $name"
    local dbg=gdb
    command -v gdb > /dev/null || dbg=$CUDA_BIN/cuda-gdb
    timeout "$(budget 90)" "$dbg" -batch -ex run -ex bt -ex "info threads" --args "$@" > "$WORK/$name.gdb.log" 2>&1
    grep -E "^#|signal|SIG" "$WORK/$name.gdb.log" | head -40
  fi
}

step model_tiny 120 "$PACK/bin/model_test" --gtest_color=no --gtest_filter='CudaModel.*'
step golden 120 "$PACK/bin/golden_cuda_test" --gtest_color=no
step ops_rope 60 "$PACK/bin/ops_test" --gtest_color=no --gtest_filter='CudaOps.Rope*:CudaOps.AttentionOneToken'
step memcheck_tiny 150 "$CUDA_BIN/compute-sanitizer" --tool memcheck --print-limit 20 \
  "$PACK/bin/model_test" --gtest_color=no --gtest_filter='CudaModel.TinyActivations*'
step sample 60 "$PACK/bin/sample_test" --gtest_color=no
step graph 90 "$PACK/bin/graph_test" --gtest_color=no
step ops 150 "$PACK/bin/ops_test" --gtest_color=no
tar czf "$FINAL/diag_logs.tar.gz" -C "$WORK" . 2>/dev/null
echo "== done in $(( $(date +%s) - START )) s"
