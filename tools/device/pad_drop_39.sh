#!/usr/bin/env bash
# Branch next/moe-pad-drop's call (~8 min on an H100): the whole GPU suite with a graph bucket's padding
# rows routed to no expert (ops_test's NormRouterRoutesAPaddedPlansTailNowhere among the tests), then
# decode steps at batches that pad (bucket 64 for 40-56, 256 for 200-240), padding dropped (default)
# against routed (OSSRT_CUDA_MOE_DROP_PADDING=0), and the 16-row pipe tiles forced at 5-8 rows an expert
# with the padding dropped (OSSRT_CUDA_MOE_WGMMA_TILE=16: did the padding's crowded experts make them
# lose on the 20b in session 38?).
# Device call from the repo root (carry [".carry/cudaz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/pad_drop_39.sh
set -uo pipefail
T0=$(date +%s)
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
TEST_S=240 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
BATCHES="40 48 56 200 240" MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=150 tools/device/decode_ab.sh \
  drop= keep=OSSRT_CUDA_MOE_DROP_PADDING=0 drop16=OSSRT_CUDA_MOE_WGMMA_TILE=16 drop2= \
  keep2=OSSRT_CUDA_MOE_DROP_PADDING=0 2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
BATCHES="160 192 224" MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=256 DEADLINE_S=150 tools/device/decode_ab.sh \
  drop= keep=OSSRT_CUDA_MOE_DROP_PADDING=0 2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
echo "== done after $(( $(date +%s) - T0 )) s"
