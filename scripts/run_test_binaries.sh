#!/usr/bin/env bash
# Runs every unit test executable of a build once, all its test cases in one process, two at a
# time; prints one line per executable and "N passed, N failed" last. The sanitizer stage uses it
# instead of ctest's one-process-per-case (gtest_discover_tests): under ASan each process pays
# seconds of start-up (the 200k-token tokenizer, dummy weights), which per case would multiply the
# stage's time several fold.
# Usage: scripts/run_test_binaries.sh BUILD_DIR [LABEL (default unit)]
set -uo pipefail
BUILD_DIR=${1:?usage: run_test_binaries.sh BUILD_DIR [LABEL]}
LABEL=${2:-unit}
export OSSRT_SOURCE_DIR=${OSSRT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
mapfile -t binaries < <(ctest --test-dir "$BUILD_DIR" -L "$LABEL" --show-only=json-v1 2>/dev/null | python3 -c '
import json, sys
print("\n".join(sorted({t["command"][0] for t in json.load(sys.stdin).get("tests", []) if t.get("command")})))')
[ ${#binaries[@]} -gt 0 ] || { echo "no test executables labelled $LABEL in $BUILD_DIR"; echo "0 passed, 1 failed"; exit 1; }
logs=$(mktemp -d)
run_one() {
  local bin=$1 logs=$2 name start rc
  name=$(basename "$bin")
  start=$(date +%s)
  (cd "$OSSRT_SOURCE_DIR" && timeout "${OSSRT_BINARY_TIMEOUT:-1800}" "$bin" --gtest_brief=1) > "$logs/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then echo "PASS $name ($(( $(date +%s) - start )) s)"
  else echo "FAIL $name (exit $rc, $(( $(date +%s) - start )) s)"; tail -40 "$logs/$name.log" | sed 's/^/    /'; fi
}
export -f run_one
printf '%s\n' "${binaries[@]}" | xargs -P "${OSSRT_TEST_JOBS:-2}" -I{} bash -c 'run_one "$@"' _ {} "$logs" | tee "$logs/summary"
passed=$(grep -c '^PASS ' "$logs/summary")
failed=$(grep -c '^FAIL ' "$logs/summary")
rm -rf "$logs"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
