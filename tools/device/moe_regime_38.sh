#!/usr/bin/env bash
# Where the small-M MXFP4 MoE should hand over to the wgmma pipe (session 38): the whole MoE alone in
# both regimes at 1-64 rows an expert (moe_mxfp4_test's TimeRegimes, L2 flushed), then decode steps
# (`bench cost`) with the regime bound moved by OSSRT_CUDA_MOE_SMALL_M_ROWS (default 16; 0 = the pipe
# from one row an expert): 20b rows an expert = batch / 8, 120b = batch / 32.
# Device call from the repo root (carry [".carry/cudaz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/moe_regime_38.sh
set -uo pipefail
T0=$(date +%s)
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
source tools/device/pack_env.sh  # LD_LIBRARY_PATH, OSSRT_SOURCE_DIR
OSSRT_MOE_TIMING=1 timeout 150 "$PACK"/bin/moe_mxfp4_test --gtest_filter='*TimeRegimes*' 2>&1 |
  grep -E "^\[timing\]|PASSED|FAILED" | tee "${OUT:-/tmp}/time_regimes.txt" | grep -E "T=  *(1|8|64|128|256|512) " | grep -vE "pipe|ring"
echo "== regimes done after $(( $(date +%s) - T0 )) s"
BATCHES="32 64 96 128" MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=150 tools/device/decode_ab.sh \
  d16= r8=OSSRT_CUDA_MOE_SMALL_M_ROWS=8 r0=OSSRT_CUDA_MOE_SMALL_M_ROWS=0 d16b= 2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
BATCHES="256 512" MODEL=gpt-oss-120b QUANT=mxfp4 DEADLINE_S=170 tools/device/decode_ab.sh \
  d16= r8=OSSRT_CUDA_MOE_SMALL_M_ROWS=8 r0=OSSRT_CUDA_MOE_SMALL_M_ROWS=0 2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
echo "== done after $(( $(date +%s) - T0 )) s"
