#!/usr/bin/env bash
# One call (~8.5 min): the pack's GPU suite (main + next/attn-trigger + next/router-compact), then whether
# a kernel's size is part of its latency at batch 1 beyond the decode attention: the compact router top-k
# (fused one-token router 2,768 -> 936 SASS instructions) against the same build without it (ossrt_old,
# packed by EXTRA_BINARIES), interleaved, `bench cost` ITL at batch 1 and 1k; then, on an H200, the
# 120b's one-stream serve bar (issue 15: 400 tok/s a user).
# Device call from the repo root (carry [".carry/cudaz", ".carry/tokgz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/router_ab_37.sh
set -uo pipefail
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== $gpu"
TEST_S=200 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
O=OSSRT_AB_BIN=ossrt_old
BATCHES=1 MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=1024 DEADLINE_S=125 tools/device/decode_ab.sh \
  old=$O new= old2=$O new2= 2>&1 | grep -E "^==|^ *mxfp4"
BATCHES=1 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=1024 DEADLINE_S=55 tools/device/decode_ab.sh \
  old=$O new= old2=$O new2= 2>&1 | grep -E "^==|^ *mxfp4"
echo "== A/B done after $(( $(date +%s) - T0 )) s"
if [[ $gpu == *H200* ]]; then
  PARTS=120b tools/device/serve_bars.sh 2>&1 | grep -E "^==|tok/s a user|!!"
fi
echo "== done after $(( $(date +%s) - T0 )) s"
