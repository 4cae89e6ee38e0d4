#!/usr/bin/env bash
# Session 40's second pack (~7 min): the 3-tile ring as the default for one long bf16 sequence.
#   1. the whole GPU suite on the pack (the ring tests take ring 3; the launcher now picks it at 512 CTAs)
#   2. `bench cost` decode steps, 20b `mxfp4-fp8`, batch 1 at 1k and 32k: the default (ring 3 at 32k)
#      against OSSRT_CUDA_ATTN_DECODE_RING=2 (the old default there), alternating
#   3. with what time is left: fp8_small_m_40.sh's A/B (the FP8 experts' small-M bound), no second suite
# Device call from the repo root (carry [".carry/cudaz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/ring3_check_40.sh
set -uo pipefail
T0=$(date +%s)
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), pack $(tr '\n' ' ' < .carry/cuda/COMMIT)"
TEST_S=240 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
BATCHES=1 CONTEXT=1024,32768 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=100 tools/device/decode_ab.sh \
  dflt= r2=OSSRT_CUDA_ATTN_DECODE_RING=2 dfltb= r2b=OSSRT_CUDA_ATTN_DECODE_RING=2 \
  2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
echo "== ring A/B done after $(( $(date +%s) - T0 )) s"
BATCHES="32 64 96 128" MODEL=gpt-oss-20b QUANT=fp8 DEADLINE_S=$(( 560 - ($(date +%s) - T0) )) tools/device/decode_ab.sh \
  r16= r0=OSSRT_CUDA_MOE_SMALL_M_ROWS=0 r8=OSSRT_CUDA_MOE_SMALL_M_ROWS=8 r4=OSSRT_CUDA_MOE_SMALL_M_ROWS=4 \
  2>&1 | grep -E "^==|^ *fp8|exit [^0]|skipped"
echo "== done after $(( $(date +%s) - T0 )) s"
