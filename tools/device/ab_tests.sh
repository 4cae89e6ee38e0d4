#!/usr/bin/env bash
# Which change moved a numerics-sensitive GPU test: runs the given test binaries (with gtest filters)
# under several variants at once and prints each variant's summary and [metric] lines. A variant is
# label=BIN_DIR[,VAR=value...] (BIN_DIR holding the test binaries, e.g. .carry/cuda/bin or an older
# build's); libraries come from .carry/cuda/lib. Device call from the repo root.
# Usage: TESTS="engine_cuda_test model_test:*Bf16Floor*" tools/device/ab_tests.sh new=.carry/cuda/bin ...
set -uo pipefail
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
export OSSRT_SOURCE_DIR=$ROOT
LOGS=${OUT:-/tmp/ossrt-out}/ab_tests
mkdir -p "$LOGS"
for variant in "$@"; do
  label=${variant%%=*}
  IFS=',' read -ra parts <<< "${variant#*=}"
  dir=${parts[0]}
  envs=("${parts[@]:1}")
  for spec in $TESTS; do
    bin=${spec%%:*}
    filter='*'
    [ "$spec" != "$bin" ] && filter=${spec#*:}
    env "${envs[@]}" timeout "${TEST_S:-120}" "$dir/$bin" --gtest_filter="$filter" --gtest_color=no \
      > "$LOGS/$label.$bin.log" 2>&1 &
  done
done
wait
for variant in "$@"; do
  label=${variant%%=*}
  for spec in $TESTS; do
    bin=${spec%%:*}
    echo "== $label $bin: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' "$LOGS/$label.$bin.log" | tr '\n' ' ')"
    grep -E "^\[metric\]|^\[  FAILED  \] [A-Z]|logits below|logits apart|reference draws|Failure$|  Actual|Which is|Expected" "$LOGS/$label.$bin.log" | cut -c1-220 | head -24
  done
done
