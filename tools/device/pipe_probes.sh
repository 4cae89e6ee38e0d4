#!/usr/bin/env bash
# Session 33's unrun probes, in one device call (each answers a question in docs/kernels.md):
#   1. the prefill pipe's ping-pong (AttentionArgs::prefill_pingpong) against the pipe, bit for bit on the
#      8k prompt (attention_test PrefillWgmmaPipeIsTheWgmmaKernelOn8kTokens; a hang here is a turn
#      barrier that never completes), then DISABLED_PrefillTiming's pipe / ping-pong rows;
#   2. the MXFP4 pipe's register-A MMA loop alone by tile width (moe_mxfp4_test
#      DISABLED_WgmmaRsRateByTileWidth: is m64n48 near the tensor rate, or ~50% as the decode step's
#      MoE suggests?);
#   3. TTFT through the model, ping-pong off / on / off / on (prefill_ab.sh, bench cost, 1k and 8k).
# Device call from the repo root after tools/device/cuda_pack.sh (XZ=1), carry [".carry/cudaz"]:
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/pipe_probes.sh
# Output: every step's lines, the step-1 verdict again last; the whole log in $OUT/pipe_probes.log.
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK, OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
mkdir -p "${OUT:-/tmp/ossrt-out}"
exec > >(tee "${OUT:-/tmp/ossrt-out}/pipe_probes.log") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== 1. ping-pong: bits, then timing (commit $(tr '\n' ' ' < "$PACK/COMMIT"))"
timeout 120 "$PACK/bin/attention_test" --gtest_color=no --gtest_filter='*PrefillWgmmaPipeIsTheWgmmaKernelOn8kTokens*' \
  > /tmp/pingpong_bits.log 2>&1
verdict="-- ping-pong bits: exit $? $(grep -E '^\[  (PASSED|FAILED) ' /tmp/pingpong_bits.log | tr '\n' ' ')"
echo "$verdict"
grep -E "Failure|pingpong|ping-pong" /tmp/pingpong_bits.log | head -5
timeout 150 "$PACK/bin/attention_test" --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_PrefillTiming*' 2>&1 |
  grep -E "wgmma_pipe|FAIL"
echo "== 2. register-A wgmma rate by tile width"
timeout 60 "$PACK/bin/moe_mxfp4_test" --gtest_also_run_disabled_tests --gtest_filter='*WgmmaRsRate*' 2>&1 |
  grep -E "wgmma_rs_rate|FAIL"
echo "== 3. TTFT, ping-pong off / on, twice"
INPUT_LENS="1024 8192" REPEATS=3 DEADLINE_S=${DEADLINE_S:-200} "$ROOT/tools/device/prefill_ab.sh" \
  off= on=OSSRT_ATTN_PREFILL_PINGPONG=1 off2= on2=OSSRT_ATTN_PREFILL_PINGPONG=1 2>&1 | tail -30
echo "== 1 again"
echo "$verdict"
