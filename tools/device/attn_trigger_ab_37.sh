#!/usr/bin/env bash
# Branch next/attn-trigger (on next/attn-b1) before either merges: the whole GPU suite (next/attn-b1's
# plain-step attention form never ran its suite: session 36's budget ended), then where the decode
# attention triggers its successor's launch (OSSRT_CUDA_ATTN_DEPENDENTS=wait|tiles|exit; wait is the
# default): at batch 1 the O projection's weight stream, launched right after attention's PDL wait, may
# delay attention's own loads (alone it takes 3.7 / 5.2 us at 1k, in the step it adds ~11-13).
# 120b `mxfp4` and 20b `mxfp4-fp8` at 1k, 20b at 32k, `bench cost`. ~6 min.
# Device call from the repo root: tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/attn_trigger_ab_37.sh
set -uo pipefail
T0=$(date +%s)
D=OSSRT_CUDA_ATTN_DEPENDENTS
show() { grep -E "^==|^ *mxfp4"; }
nvidia-smi --query-gpu=name --format=csv,noheader
TEST_S=210 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
BATCHES=1 MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=1024 DEADLINE_S=170 tools/device/decode_ab.sh \
  wait= tiles=$D=tiles exit=$D=exit wait2= tiles2=$D=tiles exit2=$D=exit 2>&1 | show
BATCHES="1 8" MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=1024 DEADLINE_S=60 tools/device/decode_ab.sh \
  wait1k= tiles1k=$D=tiles exit1k=$D=exit 2>&1 | show
BATCHES=1 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=32768 DEADLINE_S=60 tools/device/decode_ab.sh \
  wait32k= tiles32k=$D=tiles exit32k=$D=exit 2>&1 | show
echo "== done after $(( $(date +%s) - T0 )) s"
