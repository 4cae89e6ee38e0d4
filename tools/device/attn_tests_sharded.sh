#!/usr/bin/env bash
# attention_test alone in 4 gtest shards at once (about a minute): the kernels' correctness before
# timing them. Device call from the repo root, pack unpacked into .carry/cuda.
# Usage: [FILTER='*'] tools/device/attn_tests_sharded.sh
set -uo pipefail
source "$(pwd)/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
echo "== attention_test, 4 shards, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 240 "$PACK/bin/attention_test" --gtest_color=no \
    --gtest_filter="${FILTER:-*}" > "/tmp/attention_test.$i.log" 2>&1 &
done
wait
for i in 0 1 2 3; do
  echo "-- shard $i: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' /tmp/attention_test.$i.log | tr '\n' ' ')"
  grep -E -A6 "Failure$" "/tmp/attention_test.$i.log" | head -40
  grep -E "^\[  FAILED|elements identical" "/tmp/attention_test.$i.log"
done
