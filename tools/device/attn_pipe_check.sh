#!/usr/bin/env bash
# The producer/consumer prefill attention (PrefillTiling::WgmmaPipe24, docs/kernels.md) in one call:
# its bit-identity test first (a hang or a failure stops here), the prefill timing test, the whole GPU
# suite (SUITE=0: attention_test alone, in 4 shards), TTFT at 1k / 8k with the pipe forced
# (OSSRT_ATTN_PREFILL_TILING=24) against the default, interleaved twice, then the pipe's 8k launch
# under ncu (NCU=0: not; TTFT=0 skips the TTFT A/B).
# Device call from the repo root, pack unpacked into .carry/cuda.
# Usage: [SUITE=1] [NCU=1] [TTFT=1] tools/device/attn_pipe_check.sh
set -uo pipefail
source "$(pwd)/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 "$PACK/bin/attention_test" --gtest_filter='*PrefillWgmmaPipeIsTheWgmma*' 2>&1 |
  grep -E "^\[ +(OK|FAILED|PASSED) |Failure|identical|Expected|Which is" | head -20
[ "${PIPESTATUS[0]}" = 0 ] || { echo "== the pipe's 8k test failed or hung: stopping"; exit 1; }
NCU=0 tools/device/attn_prefill_probe.sh
if [ "${SUITE:-1}" = 1 ]; then
  TEST_S=200 tools/device/gpu_tests_parallel.sh 2>&1 | tail -40
else
  tools/device/attn_tests_sharded.sh
fi
if [ "${TTFT:-1}" = 1 ]; then
  DEADLINE_S=220 REPEATS=3 tools/device/prefill_ab.sh default= pipe=OSSRT_ATTN_PREFILL_TILING=24 \
    default2= pipe2=OSSRT_ATTN_PREFILL_TILING=24 2>&1 | grep -E "^== |^mxfp4" | head -40
fi
if [ "${NCU:-1}" = 1 ]; then
  TEST="attention_test --gtest_filter=*PrefillWgmmaPipeIsTheWgmmaKernelOn8kTokens*" \
    KERNELS='regex:prefill_wgmma_pipe' SKIP=0 LABEL=attn_prefill8k_pipe DEADLINE_S=100 tools/device/ncu_sass.sh
fi
