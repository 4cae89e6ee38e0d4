#!/usr/bin/env bash
# One call for a scarce device (~8 min): the pack's whole GPU suite, then what the card can measure.
# On an H200 the one-stream serve bars (serve_bars.sh PARTS="120b 20b": issue 15's 120b 400 tok/s a user,
# issue 16's 32k within 15%); on another card the batch-1 trigger A/B of attn_trigger_ab_37.sh at 120b.
# Device call from the repo root (carry [".carry/cudaz", ".carry/tokgz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/suite_then_bars_37.sh
set -uo pipefail
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== $gpu"
TEST_S=210 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
if [[ $gpu == *H200* ]]; then
  PARTS="120b 20b" tools/device/serve_bars.sh 2>&1 | grep -E "^==|tok/s a user|slower than|!!"
else
  D=OSSRT_CUDA_ATTN_DEPENDENTS
  BATCHES=1 MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=1024 DEADLINE_S=170 tools/device/decode_ab.sh \
    wait= tiles=$D=tiles exit=$D=exit wait2= generic=OSSRT_CUDA_ATTN_DECODE_PLAIN=0 2>&1 | grep -E "^==|^ *mxfp4"
fi
echo "== done after $(( $(date +%s) - T0 )) s"
