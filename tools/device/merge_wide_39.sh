#!/usr/bin/env bash
# Branch next/attn-merge-wide's call (session 39, ~6 min on an H100; the branch lost and was not merged:
# bench/results/20261207_session39_h100_merge_wide/): the decode attention's folded split merge with
# its partials staged in shared memory by cp.async (merge_kv_head_folded) against main's register loads.
#   1. the whole GPU suite (attention_test's DecodeMergeFoldedIsTheMergeKernel: bit for bit the merge kernel)
#   2. one launch alone (attention_test DISABLED_DecodeTiming), this build against main's (attention_test_main)
#   3. `bench cost` decode steps at batch 1, 1k and 32k contexts, this build against main's (ossrt_main),
#      alternating
#   4. one stream through `ossrt serve`, 1k and 32k prompts (issue 16: 32k within 15% of 1k), both builds
# Pack: EXTRA_BINARIES="<main build>/ossrt_main <main build>/attention_test_main" XZ=1 tools/device/cuda_pack.sh
# Device call from the repo root (carry [".carry/cudaz", ".carry/tokgz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/merge_wide_39.sh
set -uo pipefail
T0=$(date +%s)
PACK=.carry/cuda
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
TEST_S=240 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
source tools/device/pack_env.sh
for bin in attention_test attention_test_main attention_test attention_test_main; do
  echo "== $bin"
  timeout 60 "$PACK/bin/$bin" --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_DecodeTiming' 2>&1 |
    grep -E "decode_timing (full|window)" | grep -E "folded, plain" | grep -E "32k|full 1k +keys  128"
done
echo "== timing done after $(( $(date +%s) - T0 )) s"
BATCHES=1 CONTEXT=1024,32768 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=150 tools/device/decode_ab.sh \
  wide= main=OSSRT_AB_BIN=ossrt_main wide2= main2=OSSRT_AB_BIN=ossrt_main 2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
echo "== decode done after $(( $(date +%s) - T0 )) s"
for b in ossrt ossrt_main; do
  suffix=; [ "$b" = ossrt ] || suffix=_main
  env DEADLINE_S=110 SERVE_CONCURRENCY=1 SERVE_PROMPTS=4 QUANT=mxfp4-fp8 SERVE_LONG_INPUT=32768 \
    SERVE_CONCURRENCY_8K=1 SERVE_PROMPTS_8K=3 OSSRT_BIN=$b RUN_SUFFIX=$suffix tools/device/bench_h200.sh serve 2>&1 |
    grep -E "^== (bench|wrote)|!!"
done
mkdir -p /tmp/serve_m && for t in "${OUT:-/tmp/ossrt-out}"/*__serve.tar.gz; do tar xzf "$t" -C /tmp/serve_m; done
python3 - /tmp/serve_m <<'PY'
import csv, glob, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*", "serve_*", "serve_summary.csv"))):
    run, point = f.split(os.sep)[-3:-1]
    for r in csv.DictReader(open(f)):
        print(f"{run[-30:]:30s} {point:14s} TPOT {float(r['tpot_ms_median']):6.3f} ms  {float(r['tok_s_per_user']):7.1f} tok/s a user")
PY
echo "== done after $(( $(date +%s) - T0 )) s"
