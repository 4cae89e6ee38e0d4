#!/usr/bin/env bash
# Installs dependencies, builds (warnings as errors), checks format and citations (scripts/lint.sh),
# and runs every test that can run on this machine: end-to-end server tests (ctest, label e2e) and
# the GPU tests (label gpu) only where a GPU is present. Then the sanitizer stage, in an ASan+UBSan
# build made with clang (build-asan): every unit and golden test executable once
# (scripts/run_test_binaries.sh), the end-to-end tests against the sanitized server, and each
# libFuzzer target for a bounded time (scripts/fuzz.sh; OSSRT_FUZZ_SECONDS per target, default 30).
# OSSRT_SKIP_SANITIZE=1 skips that stage, and the main tree then builds and runs the unit tests
# (ctest, label unit) itself. The last line is "N passed, N failed", counting both stages (a unit
# test executable and a fuzzer count as one test each in the sanitizer stage).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh || { echo "0 passed, 1 failed"; exit 1; }
# A target that fails to compile must not hide every other test: build what can be built, run it,
# and count the failed build as one more failure.
build_failed=0
# Warnings in our C++ are errors in this build (CMakeLists.txt, OSSRT_WERROR). Both trees are unity
# builds (CMAKE_UNITY_BUILD: a library's sources compiled in batches), which parse the heavy headers
# (Boost.Beast, nlohmann-json, spdlog) and instantiate their templates once per batch instead of
# once per file: a cold library build costs ~2.5x less CPU, and CI builds cold on two cores.
# When the sanitizer stage runs, the unit tests run there (each executable once, under ASan+UBSan)
# and the main tree leaves them out (OSSRT_UNIT_TESTS=OFF): it builds the product, the GPU tests
# and the benchmarks, and runs the end-to-end tests against the optimised server. Built and run in
# both trees, they made a cold CI run outlast its 90 minutes.
main_flags=(-DOSSRT_WERROR=ON -DCMAKE_UNITY_BUILD=ON)
[ "${OSSRT_SKIP_SANITIZE:-0}" = 1 ] || main_flags+=(-DOSSRT_UNIT_TESTS=OFF)
OSSRT_KEEP_GOING=1 bash scripts/build.sh "${main_flags[@]}" || build_failed=1
echo "== build done after $SECONDS s"
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
# Format and citations (scripts/lint.sh): one test.
if bash scripts/lint.sh; then passed=$((passed + 1)); echo "== lint: ok"; else failed=$((failed + 1)); echo "== lint: FAILED"; fi

echo "== tests done after $SECONDS s"
if [ "${OSSRT_SKIP_SANITIZE:-0}" != 1 ]; then
  SAN_DIR=${OSSRT_SANITIZE_BUILD_DIR:-build-asan}
  echo "== sanitizer stage: ASan + UBSan (clang-16) in $SAN_DIR"
  san_build_failed=0
  # -O1 -g1: sanitizer builds want optimisation for speed and line tables for reports, and compile
  # about twice as fast as -O2 -g on CI's two cores.
  OSSRT_BUILD_DIR="$SAN_DIR" OSSRT_KEEP_GOING=1 bash scripts/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 -DOSSRT_CUDA=OFF -DCMAKE_UNITY_BUILD=ON \
    -DOSSRT_SANITIZE=address,undefined -DOSSRT_FUZZ=ON -DOSSRT_BENCHMARKS=OFF || san_build_failed=1
  # Leaks count; a report aborts the process it happened in, which fails that test.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  # Unit tests: each executable once, all its cases in one process (ctest's process per case would
  # pay the sanitized start-up -- tokenizer, dummy weights -- hundreds of times). One executable
  # counts as one test here.
  echo "== sanitizer build done after $SECONDS s; unit test executables"
  san_log=$(mktemp)
  bash scripts/run_test_binaries.sh "$SAN_DIR" unit 2>&1 | tee "$san_log"
  san_counts=$(tail -1 "$san_log")
  if [[ "$san_counts" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2]))
  else
    failed=$((failed + 1))
  fi
  echo "== after $SECONDS s: end-to-end tests against the sanitized server"
  san_e2e_log=$(mktemp)
  (cd "$SAN_DIR" && ctest -L e2e --output-on-failure --timeout 1800 -j "${OSSRT_TEST_JOBS:-2}") 2>&1 | tee "$san_e2e_log"
  san_total=$(grep -Eo 'tests passed, [0-9]+ tests failed out of [0-9]+' "$san_e2e_log" | grep -Eo '[0-9]+$' | tail -1)
  san_failed=$(grep -Eo '[0-9]+ tests failed out of' "$san_e2e_log" | grep -Eo '^[0-9]+' | tail -1)
  if [ -z "$san_total" ]; then san_total=1; san_failed=1; fi
  passed=$((passed + san_total - san_failed))
  failed=$((failed + san_failed + san_build_failed))
  echo "== after $SECONDS s: fuzzers (${OSSRT_FUZZ_SECONDS:-30} s each)"
  fuzz_log=$(mktemp)
  bash scripts/fuzz.sh "$SAN_DIR" "${OSSRT_FUZZ_SECONDS:-30}" | tee "$fuzz_log"
  fuzz_ok=$(grep -c ': ok,' "$fuzz_log")
  fuzz_bad=$(grep -c ': FAILED' "$fuzz_log")
  if [ $((fuzz_ok + fuzz_bad)) -eq 0 ]; then fuzz_bad=1; echo "no fuzzers ran"; fi
  passed=$((passed + fuzz_ok))
  failed=$((failed + fuzz_bad))
fi
echo "== all done after $SECONDS s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
