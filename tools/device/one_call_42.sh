#!/usr/bin/env bash
# Session 42's first call: what runs depends on the card that comes.
#   H200: the issue bars (h200_bars_37.sh, ~8 min); the suite in the next call.
#   else: the whole GPU suite on this pack (branch next/fp8-small-m rebased on main: the FP8 experts'
#         small-M bound of 12 rows has run only fp8_moe_test and fp8_linear_test), then batch-1 decode
#         steps kernel by kernel (kernel_trace.sh, 1k context) for gpt-oss-120b `mxfp4` and gpt-oss-20b
#         `mxfp4-fp8`: where today's batch-1 layer goes (the last 120b trace is session 36's, before the
#         attention's plain form).
# Device call from the repo root (carry [".carry/cudaz", ".carry/tokgz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/one_call_42.sh
set -uo pipefail
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== $gpu, pack $(tr '\n' ' ' < .carry/cuda/COMMIT)"
case $gpu in
  *H200*) tools/device/h200_bars_37.sh ;;
  *)
    TEST_S=240 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
    echo "== suite done after $(( $(date +%s) - T0 )) s"
    MODEL=gpt-oss-120b QUANT=mxfp4 BATCHES=1 DEADLINE_S=110 tools/device/kernel_trace.sh 2>&1 | head -45
    MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES=1 DEADLINE_S=90 tools/device/kernel_trace.sh 2>&1 | head -40
    echo "== done after $(( $(date +%s) - T0 )) s"
    ;;
esac
