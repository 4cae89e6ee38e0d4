#!/usr/bin/env bash
# Runs every libFuzzer target of a -DOSSRT_FUZZ=ON build (tests/fuzz) for a bounded time each,
# starting from the committed corpus tests/fuzz/corpus/<target> (read only: inputs the fuzzer
# finds go to a scratch directory). Prints one line per target with its executions and
# executions per second. A crash is copied to tests/fuzz/corpus/<target>/crash-<sha1>: commit it,
# and fuzz_regression_test replays it from then on. Exit status: the number of crashed targets.
# Usage: scripts/fuzz.sh BUILD_DIR [SECONDS_PER_TARGET (default 30)]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:?usage: scripts/fuzz.sh BUILD_DIR [SECONDS]}
SECONDS_PER_TARGET=${2:-30}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
for fuzzer in "$BUILD_DIR"/tests/fuzz/*_fuzzer; do
  [ -x "$fuzzer" ] || continue
  target=$(basename "$fuzzer" _fuzzer)
  mkdir -p "$scratch/$target/corpus" "$scratch/$target/artifacts"
  log="$scratch/$target/log"
  # -rss_limit_mb / -timeout: a slow or memory-hungry input is a finding too (a client could send it).
  # The first input also pays the target's one-time setup (the 200k-token tokenizer under ASan and
  # coverage: 11 s in a cold CI run, which a 10 s limit reported as a hang of the empty input), so the
  # limit is 30 s: far above any one input's time once set up, still a hang's finding.
  "$fuzzer" "$scratch/$target/corpus" "tests/fuzz/corpus/$target" -max_total_time="$SECONDS_PER_TARGET" \
    -print_final_stats=1 -timeout=30 -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix="$scratch/$target/artifacts/" >"$log" 2>&1
  rc=$?
  runs=$(grep -Eo 'stat::number_of_executed_units: [0-9]+' "$log" | grep -Eo '[0-9]+$' || echo 0)
  rate=$(grep -Eo 'stat::average_exec_per_sec: +[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo 0)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $target: ok, $runs executions in ${SECONDS_PER_TARGET} s ($rate exec/s)"
  else
    failed=$((failed + 1))
    echo "fuzz $target: FAILED (exit $rc) after $runs executions ($rate exec/s)"
    grep -E 'ERROR|SUMMARY|property violated|==[0-9]+==' "$log" | head -20
    for artifact in "$scratch/$target/artifacts"/*; do
      [ -f "$artifact" ] || continue
      sha=$(sha1sum "$artifact" | cut -c1-40)
      cp "$artifact" "tests/fuzz/corpus/$target/crash-$sha"
      echo "  input saved as tests/fuzz/corpus/$target/crash-$sha"
    done
  fi
done
exit "$failed"
