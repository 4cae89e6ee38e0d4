#!/usr/bin/env bash
# Session 38's third call: the whole GPU suite with the MXFP4 pipe's 16-row route tiles (the default at
# 5-8 rows an expert; moe_mxfp4_test's WgmmaPipe16RowTilesAreTheRingBitForBit among the tests), then
# decode steps at 5-8 rows an expert, 16-row tiles (default) against 32 (OSSRT_CUDA_MOE_WGMMA_TILE=32,
# the choice before): 20b (rows = batch / 8) and 120b at a 256-token context (rows = batch / 32).
# Device call from the repo root (carry [".carry/cudaz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/suite_pipe16_38.sh
set -uo pipefail
T0=$(date +%s)
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
TEST_S=240 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
cat /tmp/gpu-tests/moe_mxfp4_test.*.log 2>/dev/null | grep -E "\[metric\].*narrow tile 16" | head -24
echo "== suite done after $(( $(date +%s) - T0 )) s"
BATCHES="40 48 56 64" MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=120 tools/device/decode_ab.sh \
  t16= t32=OSSRT_CUDA_MOE_WGMMA_TILE=32 t16b= t32b=OSSRT_CUDA_MOE_WGMMA_TILE=32 2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
BATCHES="160 192 256" MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=256 DEADLINE_S=150 tools/device/decode_ab.sh \
  t16= t32=OSSRT_CUDA_MOE_WGMMA_TILE=32 2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
echo "== done after $(( $(date +%s) - T0 )) s"
