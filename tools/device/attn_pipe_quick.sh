#!/usr/bin/env bash
# The producer/consumer prefill attention's short check (attn_pipe_check.sh without the whole suite
# and ncu, for a call with little device time left): its 8k bit-identity test, attention_test in 4
# shards, the prefill timing test, TTFT 1k / 8k against the 16-token kernel, interleaved.
# Device call from the repo root, pack unpacked into .carry/cuda. Usage: tools/device/attn_pipe_quick.sh
set -uo pipefail
source "$(pwd)/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 40 "$PACK/bin/attention_test" --gtest_filter='*PrefillWgmmaPipeIsTheWgmma*' 2>&1 |
  grep -E "^\[ +(OK|FAILED|PASSED) |Failure|identical|Expected|Which is" | head -20
[ "${PIPESTATUS[0]}" = 0 ] || { echo "== the pipe's 8k test failed or hung: stopping"; exit 1; }
tools/device/attn_tests_sharded.sh
NCU=0 tools/device/attn_prefill_probe.sh 2>&1 | grep -E "full n=(4096|8192)|sliding n=8192|FAILED"
DEADLINE_S=120 REPEATS=3 tools/device/prefill_ab.sh wgmma16=OSSRT_ATTN_PREFILL_TILING=64 pipe= \
  wgmma16b=OSSRT_ATTN_PREFILL_TILING=64 pipe2= 2>&1 | grep -E "^== |^mxfp4" | head -20
