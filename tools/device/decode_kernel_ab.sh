#!/usr/bin/env bash
# A change to the decode attention kernel, checked and timed against an older build in one device call:
#   1. the GPU tests that run the kernel, in parallel (attention_test and ops_test in 4 shards each,
#      kv_fp8_kernels_test, kv_fp8_model_test, golden_cuda_test, engine_cuda_test, eagle3_cuda_test), one line each
#      (printed again at the end; the whole output also in $OUT/decode_kernel_ab.log);
#   2. attention_test's DISABLED_DecodeTimingManySequences (the kernel alone at 64-256 sequences) for
#      this pack's attention_test and for OLD_TEST, the older build's (cuda_pack.sh EXTRA_BINARIES);
#   3. `bench cost` decode steps at BATCHES, this build against OLD_OSSRT, interleaved twice
#      (decode_ab.sh; its tarball lands in $OUT); or with STEP3=serve, `bench serve` at SERVE_CONCURRENCY
#      (default 256) concurrent random 1k/1k requests (SERVE_PROMPTS, default 256) through `ossrt serve`,
#      this build then OLD_OSSRT (bench_h200.sh serve, run folders <run> and <run>_old in $OUT).
# Device call from the repo root after tools/device/cuda_pack.sh, carry [".carry/cudaz", ".carry/tokgz"]
# (the pack unpacked first) or [".carry/cuda", ".carry/tokgz"]. Step 1's failures do not stop steps 2 and 3 (their numbers then mean
# nothing: read step 1 first).
# Usage: [OLD_TEST=attention_test_main] [MORE_TESTS="attention_test_x ..."] [OLD_OSSRT=ossrt_main]
#        [BATCHES="1 64 256"] [QUANT=mxfp4-fp8] [TEST_S=150] [STEP3=cost|serve] [SKIP_TESTS=1]
#        tools/device/decode_kernel_ab.sh
# SKIP_TESTS=1 leaves step 1 out (e.g. after gpu_tests_parallel.sh, the whole suite, in the same call);
# SERVE_FLAGS (e.g. "--kv-cache-dtype fp8") reaches step 3's servers through bench_h200.sh.
# MORE_TESTS: further attention_test builds of the pack (EXTRA_BINARIES) timed in step 2.
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
if [ -z "${OSSRT_TOKENIZER:-}" ] && [ -f "$ROOT/.carry/tokgz/tokenizer.json.gz" ]; then
  gunzip -c "$ROOT/.carry/tokgz/tokenizer.json.gz" > /tmp/tokenizer.json && export OSSRT_TOKENIZER=/tmp/tokenizer.json
fi
OLD_TEST=${OLD_TEST:-attention_test_main}
OLD_OSSRT=${OLD_OSSRT:-ossrt_main}
LOGS=/tmp/decode-kernel-ab
mkdir -p "$LOGS" "${OUT:-/tmp/ossrt-out}" && rm -f "$LOGS/tests_summary.txt"
# The whole output also lands in $OUT, and step 1's lines are printed again last: the call's output
# tail (12,000 characters) would otherwise lose them behind steps 2 and 3.
exec > >(tee "${OUT:-/tmp/ossrt-out}/decode_kernel_ab.log") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== 1. tests, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
[ "${SKIP_TESTS:-0}" = 1 ] && echo "-- skipped (SKIP_TESTS=1)" > "$LOGS/tests_summary.txt"
pids=()
# attention_test and ops_test in 4 shards each (ops_test whole ran past 200 s beside the others).
for i in 0 1 2 3; do
  [ "${SKIP_TESTS:-0}" = 1 ] && break
  for t in attention_test ops_test; do
    GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout "${TEST_S:-150}" "$PACK/bin/$t" --gtest_color=no \
      > "$LOGS/$t.$i.log" 2>&1 &
    pids+=("$!:$t.$i")
  done
done
for t in kv_fp8_kernels_test kv_fp8_model_test golden_cuda_test engine_cuda_test eagle3_cuda_test; do
  [ "${SKIP_TESTS:-0}" = 1 ] && break
  timeout "${TEST_S:-150}" "$PACK/bin/$t" --gtest_color=no > "$LOGS/$t.log" 2>&1 &
  pids+=("$!:$t")
done
for p in "${pids[@]}"; do
  wait "${p%%:*}"
  rc=$?
  {
    echo "-- ${p#*:} exit $rc: $(grep -E '^\[  (PASSED|FAILED) ' "$LOGS/${p#*:}.log" | tr '\n' ' ')"
    [ "$rc" -eq 0 ] || grep -E '^\[  FAILED|Failure' "$LOGS/${p#*:}.log" | head -5
  } | tee -a "$LOGS/tests_summary.txt"
done
echo "== 2. the kernel alone at many sequences"
for b in attention_test "$OLD_TEST" ${MORE_TESTS:-}; do
  [ -x "$PACK/bin/$b" ] || { echo "-- $b: not in the pack"; continue; }
  echo "-- $b"
  timeout 120 "$PACK/bin/$b" --gtest_also_run_disabled_tests --gtest_filter='*DecodeTimingManySequences*' 2>&1 |
    grep -E "decode_many|FAIL"
done
if [ "${STEP3:-cost}" = serve ]; then
  echo "== 3. bench serve, concurrency ${SERVE_CONCURRENCY:-256}: this build, then $OLD_OSSRT"
  for variant in new old; do
    bin=ossrt suffix=
    [ "$variant" = old ] && bin=$OLD_OSSRT suffix=_old
    OSSRT_BIN=$bin RUN_SUFFIX=$suffix QUANT=${QUANT:-mxfp4-fp8} SERVE_CONCURRENCY=${SERVE_CONCURRENCY:-256} \
      SERVE_PROMPTS=${SERVE_PROMPTS:-256} SERVE_PROMPTS_8K=0 DEADLINE_S=${DEADLINE_S:-150} \
      "$ROOT/tools/device/bench_h200.sh" serve > "$LOGS/serve_$variant.log" 2>&1
    echo "-- $variant ($bin):"
    grep -hE "Benchmark duration|Output token throughput|Mean TPOT|Median TTFT|server ready|!!" "$LOGS/serve_$variant.log"
  done
else
  echo "== 3. decode steps, bench cost"
  MODEL=gpt-oss-20b QUANT=${QUANT:-mxfp4-fp8} BATCHES=${BATCHES:-1 64 256} DEADLINE_S=${DEADLINE_S:-200} \
    "$ROOT/tools/device/decode_ab.sh" new= old=OSSRT_AB_BIN="$OLD_OSSRT" new2= old2=OSSRT_AB_BIN="$OLD_OSSRT" 2>&1 |
    grep -E "^==|^[a-z0-9-]+ +[0-9]+ +[0-9]+ "
fi
echo "== 1 again: tests"
cat "$LOGS/tests_summary.txt"
