#!/usr/bin/env bash
# The prefill attention on wgmma, one layer (docs/kernels.md, "Prefill on wgmma"): the timing test
# (every tiling at 1k / 4k / 8k, full and window, warm L2) for each VARIANTS entry (environment
# assignments, "-" for none), then, unless NCU=0, one 8k full-layer launch of each wgmma kernel under
# ncu's source counters (where its warps stall, instruction by instruction: tools/device/ncu_sass.sh).
# Device call from the repo root, pack unpacked into .carry/cuda.
# Usage: [VARIANTS="-|OSSRT_X=1"] [NCU=1] tools/device/attn_prefill_probe.sh
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== prefill timing, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
IFS='|' read -ra variants <<< "${VARIANTS:--}"
for v in "${variants[@]}"; do
  [ "$v" = - ] && v=""
  echo "-- variant: ${v:-default}"
  env $v timeout 120 "$PACK/bin/attention_test" --gtest_also_run_disabled_tests --gtest_filter='*PrefillTiming*' 2>&1 |
    grep -E "prefill_timing .*(wgmma|tok16 n=.* variant 0)|FAILED" | grep -vE "n=1024 .*tok16"
done
# ncu: the 16-token wgmma kernel's and the producer/consumer kernel's full-layer 8k launches.
if [ "${NCU:-1}" = 1 ]; then
  TEST="attention_test --gtest_filter=*PrefillWgmmaMatchesTheMmaSyncKernelOn8kTokens*" \
    KERNELS='regex:prefill_wgmma' SKIP=0 LABEL=attn_prefill8k DEADLINE_S=120 tools/device/ncu_sass.sh
  TEST="attention_test --gtest_filter=*PrefillWgmmaPipeIsTheWgmmaKernelOn8kTokens*" \
    KERNELS='regex:prefill_wgmma_pipe' SKIP=0 LABEL=attn_prefill8k_pipe DEADLINE_S=120 tools/device/ncu_sass.sh
fi
