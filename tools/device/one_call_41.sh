#!/usr/bin/env bash
# The next session's first call (written in session 40): what runs depends on the card that comes.
#   H200: the issue bars on main's pack (h200_bars_37.sh, ~8 min: 120b and 20b one stream, the 20b at
#         32k against 1k, 256 concurrent with and without an fp8 KV cache); the suite in the next call.
#   else: the whole GPU suite on main's pack (pack branch next/fp8-small-m instead to run its suite:
#         the FP8 experts' bound of 12 rows has run only fp8_moe_test and fp8_linear_test), then the ring where session 40's rule changed it without
#         a measurement or might pay: 4 sequences at 1-2k contexts (4 x 8 KV heads x 16 splits = 512
#         CTAs: now the 3-tile ring, was 2) and 2-4 long ones (2 x 8 x 64 = 1,024 CTAs: the 2-tile
#         ring, 6 an SM, 1.3 waves; forced 3: 4 an SM, 2 waves), `bench cost` 20b `mxfp4-fp8`, ~8 min.
# Device call from the repo root (carry [".carry/cudaz", ".carry/tokgz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/one_call_41.sh
set -uo pipefail
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== $gpu, pack $(tr '\n' ' ' < .carry/cuda/COMMIT)"
case $gpu in
  *H200*) tools/device/h200_bars_37.sh ;;
  *)
    TEST_S=240 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
    echo "== suite done after $(( $(date +%s) - T0 )) s"
    BATCHES="2 4 8" CONTEXT=1024,32768 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=240 tools/device/decode_ab.sh \
      dflt= r2=OSSRT_CUDA_ATTN_DECODE_RING=2 r3=OSSRT_CUDA_ATTN_DECODE_RING=3 dfltb= r2b=OSSRT_CUDA_ATTN_DECODE_RING=2 \
      2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
    echo "== done after $(( $(date +%s) - T0 )) s"
    ;;
esac
