#!/usr/bin/env bash
# Branch next/fp8-small-m's call (~5 min): where the FP8 experts' small-M kernels should hand over to
# their wgmma pipe. kMoeSmallMMaxRows = 16 rows an expert was chosen against the mma.sync large-M
# kernels and never re-timed against the pipe (its tiles are 64 or 128 rows; the MXFP4 pipe's narrow
# tiles moved its bound from 16 to 4 in session 38). The branch makes OSSRT_CUDA_MOE_SMALL_M_ROWS move
# the FP8 bound too. gpt-oss-20b `--quantization fp8`, rows an expert = batch x 4 / 32:
#   1. the whole GPU suite (fp8_moe_test among it)
#   2. `bench cost` decode steps at 32 / 64 / 96 / 128 sequences (4 / 8 / 12 / 16 rows an expert), the
#      bound at 16 (default), 0 (the pipe from one row), 4 and 8, then the default again
# Device call from the repo root (carry [".carry/cudaz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/fp8_small_m_40.sh
set -uo pipefail
T0=$(date +%s)
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
TEST_S=240 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
BATCHES="32 64 96 128" MODEL=gpt-oss-20b QUANT=fp8 DEADLINE_S=200 tools/device/decode_ab.sh \
  r16= r0=OSSRT_CUDA_MOE_SMALL_M_ROWS=0 r4=OSSRT_CUDA_MOE_SMALL_M_ROWS=4 r8=OSSRT_CUDA_MOE_SMALL_M_ROWS=8 r16b= \
  2>&1 | grep -E "^==|^ *fp8|exit [^0]"
echo "== done after $(( $(date +%s) - T0 )) s"
