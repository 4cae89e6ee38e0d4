#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test that can run on this machine: unit and golden
# tests (ctest, label unit), end-to-end server tests (label e2e), and the GPU tests (label gpu) only
# where a GPU is present. The last line is "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh || { echo "0 passed, 1 failed"; exit 1; }
# A target that fails to compile must not hide every other test: build what can be built, run it,
# and count the failed build as one more failure.
build_failed=0
OSSRT_KEEP_GOING=1 bash scripts/build.sh || build_failed=1
BUILD_DIR=${OSSRT_BUILD_DIR:-build}
LABELS="-LE gpu"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then LABELS=""; fi
log=$(mktemp)
(cd "$BUILD_DIR" && ctest $LABELS --output-on-failure --timeout 900 -j "${OSSRT_TEST_JOBS:-2}") 2>&1 | tee "$log"
total=$(grep -Eo 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
failed=$(grep -Eo '[0-9]+ tests failed out of' "$log" | grep -Eo '^[0-9]+' | tail -1)
if [ -z "$total" ]; then
  echo "0 passed, 1 failed"
  exit 1
fi
passed=$((total - failed))
if [ "$build_failed" -ne 0 ]; then
  echo "the build failed (see above): counted as one failed test"
  failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
