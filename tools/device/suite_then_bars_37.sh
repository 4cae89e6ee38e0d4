#!/usr/bin/env bash
# One call for a scarce device (~8 min): the pack's whole GPU suite, then what the card can measure.
# On an H200 the one-stream serve bars (serve_bars.sh PARTS="120b 20b": issue 15's 120b 400 tok/s a user,
# issue 16's 32k within 15%); on another card the batch-1 steps of the 120b and the 20b at 1k and 32k.
# kv_fp8_model_test needs ~190 s alone on an H100 (its 16k-token CPU reference): TEST_S=240.
# Device call from the repo root (carry [".carry/cudaz", ".carry/tokgz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/suite_then_bars_37.sh
set -uo pipefail
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== $gpu"
TEST_S=240 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
if [[ $gpu == *H200* ]]; then
  PARTS="120b 20b" tools/device/serve_bars.sh 2>&1 | grep -E "^==|tok/s a user|slower than|!!"
else
  BATCHES=1 MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=1024 DEADLINE_S=80 tools/device/decode_ab.sh \
    b1= b1b= 2>&1 | grep -E "^==|^ *mxfp4"
  for ctx in 1024 32768; do
    BATCHES=1 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=$ctx DEADLINE_S=50 tools/device/decode_ab.sh \
      b1= b1b= 2>&1 | grep -E "^==|^ *mxfp4"
  done
fi
echo "== done after $(( $(date +%s) - T0 )) s"
