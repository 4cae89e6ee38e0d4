#!/usr/bin/env bash
# One device call for the pipes' developer switches (docs/kernels.md): the prefill attention pipe's
# 8k bit-identity test and the prefill timing, then for each SWITCHES entry (VAR=value:gtest filter)
# tools/device/pipe_switch_ab.sh with E2E=0 (its tests, then one launch of each case under ncu both
# ways), then with PREFILL_AB (prefill_ab.sh's variants, label=VAR=value[,VAR=value], run in the order
# given) the TTFT of each variant (INPUT_LENS, default 8192), then the whole GPU suite in what is left
# of DEADLINE_S (default 560).
# Device call from the repo root, pack unpacked into .carry/cuda.
# Usage: [SWITCHES="OSSRT_CUDA_MOE_PIPE_TMA=0:*TmaWeights* ..."] [AB_S=110: each entry's limit] [ATTN=0] [PREFILL_AB="off= on=VAR=1 ..."]
#        tools/device/pipe_switches_check.sh
set -uo pipefail
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-560}
left() { echo $((START + DEADLINE_S - $(date +%s))); }
source "$(pwd)/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== commit $(tr '\n' ' ' < "$PACK/COMMIT")"
if [ "${ATTN:-1}" = 1 ]; then
  timeout 60 "$PACK/bin/attention_test" --gtest_filter='*PrefillWgmmaPipeIsTheWgmma*' 2>&1 |
    grep -E "^\[ +(OK|FAILED|PASSED) |Failure|identical|Expected|Which is" | head -20
  NCU=0 timeout 100 tools/device/attn_prefill_probe.sh
fi
for sw in ${SWITCHES:-OSSRT_CUDA_MOE_PIPE_TMA=0:*TmaToken*:*TmaWeights*:*GroupedTokens*}; do
  [ "$(left)" -gt 150 ] || { echo "== no time left for $sw"; break; }
  SWITCH=${sw%%:*} E2E=0 TESTS=${sw#*:} timeout "${AB_S:-110}" tools/device/pipe_switch_ab.sh
done
if [ -n "${PREFILL_AB:-}" ]; then
  # shellcheck disable=SC2086  # the variants are words
  INPUT_LENS=${INPUT_LENS:-8192} DEADLINE_S=$(($(left) - ${SUITE_S:-200})) tools/device/prefill_ab.sh $PREFILL_AB 2>&1 |
    grep -E "^== |^-- |^(mxfp4|fp8|bf16)"
fi
t=$(($(left) - 10))
if [ "$t" -gt 60 ]; then
  echo "== the GPU suite ($t s)"
  TEST_S=$t timeout "$t" tools/device/gpu_tests_parallel.sh 2>&1 | tail -30
else
  echo "== no time left for the GPU suite"
fi
