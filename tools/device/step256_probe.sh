#!/usr/bin/env bash
# Where a 256-sequence decode step goes and what the A/B switches buy there (session 25): the narrow
# MoE tiles' deeper MMA queue checked bit for bit, ncu on the gate_up pipe and the decode attention,
# step times of the switches (bench cost, TRACE=0), and a trace with the fp8 KV cache.
# Device call from the repo root, pack unpacked into .carry/cuda. Usage: tools/device/step256_probe.sh
set -uo pipefail
ROOT=$(pwd)
export PACK=$ROOT/.carry/cuda
source "$ROOT/tools/device/pack_env.sh"
export OSSRT_SOURCE_DIR=$ROOT
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== narrow tiles at depth 2, bit for bit against the ring"
OSSRT_CUDA_MOE_PIPE_DEPTH=2 timeout 120 "$PACK/bin/moe_mxfp4_test" --gtest_filter='*Narrow*:*WgmmaPipeIsTheRing*' 2>&1 |
  grep -E "^\[ +(OK|FAILED|PASSED) |Failure" | head -20
BATCH=256 QUANT=mxfp4-fp8 COUNT=4 KERNELS='regex:gate_up_swiglu_wgmma_pipe|sdpa_sinks_d64_decode' DEADLINE_S=150 \
  LINES_MAX=${NCU_LINES:-90} tools/device/ncu_kernel_detail.sh
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES="${AB_BATCHES:-256}" TRACE=0 DEADLINE_S=200 \
  VARIANTS="${AB_VARIANTS:--|OSSRT_CUDA_MOE_PIPE_DEPTH=2|OSSRT_CUDA_ATTN_SPLIT_KEYS=1024|OSSRT_CUDA_ATTN_SPLIT_KEYS=512|-}" \
  tools/device/kernel_trace.sh 2>&1 | grep -v "^$"
TAG_SUFFIX=_kvfp8 BENCH_FLAGS="--kv-cache-dtype fp8" MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES="256" DEADLINE_S=100 \
  tools/device/kernel_trace.sh 2>&1 | head -24
