#!/usr/bin/env bash
# Session 36: the decode attention's plain-step form (branch next/attn-b1: 16-token blocks, the block
# cache and the rows before the PDL wait as constants; bf16 ring 4: 3,096 SASS instructions against the
# generic form's 8,616) against the generic form (OSSRT_CUDA_ATTN_DECODE_PLAIN=0) at batch 1, where the
# session-36 call put the regression since session 22 in this kernel (c55e4cf's kernel: 2.86 ms
# against 2.94). Then 32k at batch 1 (the 32k-within-15% bar) and the whole GPU suite. ~7 min.
# Device call from the repo root: tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/attn_plain_form_36.sh
set -uo pipefail
T0=$(date +%s)
G=OSSRT_CUDA_ATTN_DECODE_PLAIN=0
show() { grep -E "^==|^ *mxfp4"; }
nvidia-smi --query-gpu=name --format=csv,noheader
BATCHES=1 MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=1024 DEADLINE_S=130 tools/device/decode_ab.sh \
  plain= generic=$G plain2= generic2=$G 2>&1 | show
BATCHES=1 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=32768 DEADLINE_S=70 tools/device/decode_ab.sh \
  plain32k= generic32k=$G 2>&1 | show
BATCHES=1 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=1024 DEADLINE_S=40 tools/device/decode_ab.sh \
  plain1k= generic1k=$G 2>&1 | show
echo "== benchmarks done after $(( $(date +%s) - T0 )) s"
TEST_S=210 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== done after $(( $(date +%s) - T0 )) s"
