#!/usr/bin/env bash
# Every GPU test binary of .carry/cuda at once on one GPU (attention_test and ops_test in 4 gtest
# shards each): the whole suite in the time of its slowest shard (~1.5 min instead of ~4), for a
# device call that also benchmarks. Correctness only: the tests that time things are not run here.
# Device call from the repo root after tools/device/cuda_pack.sh, carry [".carry/cuda"] (or the
# compressed .carry/cudaz unpacked first). Usage: [TEST_S=150] tools/device/gpu_tests_parallel.sh
# Tests that compare the device's memory in use (CudaMemoryPlan.*: other processes' allocations would
# move it) run alone after the others.
set -uo pipefail
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
LOGS=/tmp/gpu-tests
mkdir -p "$FINAL" "$LOGS"
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
export OSSRT_SOURCE_DIR=$ROOT
START=$(date +%s)
echo "== GPU tests in parallel, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
pids=()
for t in "$PACK"/bin/*_test; do
  name=$(basename "$t")
  shards=1
  case $name in attention_test | ops_test) shards=4 ;; esac
  filter=()
  [ "$name" = graph_test ] && filter=('--gtest_filter=-CudaMemoryPlan.*')
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${TEST_S:-150}" "$t" --gtest_color=no "${filter[@]}" \
      > "$LOGS/$name.$i.log" 2>&1 &
    pids+=("$!:$name.$i")
  done
done
failed=0
for entry in "${pids[@]}"; do
  pid=${entry%%:*}
  wait "$pid"
  rc=$?
  log=$LOGS/${entry#*:}.log
  summary=$(grep -E "^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test" "$log" | tr '\n' ' ')
  echo "-- ${entry#*:} exit $rc: ${summary:-no summary}"
  if [ $rc != 0 ]; then failed=1; grep -E -A7 "Failure$" "$log" | head -60; grep -E "^\[  FAILED" "$log"; fi
done
if [ -x "$PACK/bin/graph_test" ]; then  # alone now: nothing else allocates on the device
  log=$LOGS/graph_test.memory_plan.log
  timeout 120 "$PACK/bin/graph_test" --gtest_color=no --gtest_filter='CudaMemoryPlan.*' > "$log" 2>&1
  rc=$?
  echo "-- graph_test CudaMemoryPlan.* (alone) exit $rc: $(grep -E "^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test" "$log" | tr '\n' ' ')"
  if [ $rc != 0 ]; then failed=1; grep -E -A7 "Failure$" "$log" | head -30; fi
fi
tar -C /tmp -czf "$FINAL/gpu_tests_logs.tar.gz" gpu-tests
echo "== GPU tests: $([ $failed = 0 ] && echo "all passed" || echo "FAILURES") after $(( $(date +%s) - START )) s"
exit $failed
