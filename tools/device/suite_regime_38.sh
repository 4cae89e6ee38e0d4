#!/usr/bin/env bash
# Session 38's second call: the whole GPU suite with the small-M bound at 4 rows an expert beside the
# wgmma pipe, then the bound's neighbourhood in decode steps, small M (OSSRT_CUDA_MOE_SMALL_M_ROWS=16)
# against the pipe (=0) at 3-8 rows an expert: 20b (rows = batch / 8) and 120b at a 256-token context
# (rows = batch / 32; 1k contexts at 128+ sequences do not fit an H100's KV room).
# Device call from the repo root (carry [".carry/cudaz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/suite_regime_38.sh
set -uo pipefail
T0=$(date +%s)
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
TEST_S=240 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
BATCHES="24 32 40 48 56" MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=150 tools/device/decode_ab.sh \
  small=OSSRT_CUDA_MOE_SMALL_M_ROWS=16 pipe=OSSRT_CUDA_MOE_SMALL_M_ROWS=0 small2=OSSRT_CUDA_MOE_SMALL_M_ROWS=16 \
  pipe2=OSSRT_CUDA_MOE_SMALL_M_ROWS=0 2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
BATCHES="96 128 160 192 256" MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=256 DEADLINE_S=200 tools/device/decode_ab.sh \
  small=OSSRT_CUDA_MOE_SMALL_M_ROWS=16 pipe=OSSRT_CUDA_MOE_SMALL_M_ROWS=0 def= 2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
echo "== done after $(( $(date +%s) - T0 )) s"
