#!/usr/bin/env bash
# Where a 256-sequence decode step goes and what switches buy there (docs/kernels.md, "A 256-sequence
# decode step"): the narrow MoE pipe checked bit for bit against the ring kernels, its 48-row gate_up
# kernel under ncu's source counters (the test's E = 32, T = 256 case: its second gate_up launch), step
# times interleaved twice (bench cost, TRACE=0; one run's spread is ~2%), and a trace with the fp8 KV cache.
# Device call from the repo root, pack unpacked into .carry/cuda. Usage: tools/device/step256_probe.sh
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== narrow tiles, bit for bit against the ring kernels"
timeout 120 "$PACK/bin/moe_mxfp4_test" --gtest_filter='*Narrow*:*WgmmaPipeIsTheRing*' 2>&1 |
  grep -E "^\[ +(OK|FAILED|PASSED) |Failure" | head -20
TEST="moe_mxfp4_test --gtest_filter=*NarrowTilesAreTheRing*" KERNELS='regex:gate_up_swiglu_wgmma_pipe' SKIP=1 \
  LABEL=gate_up48 tools/device/ncu_sass.sh 2>&1 | grep -E "^== |ncu exit|Duration|Issued Warp|Executed Ipc|instructions [0-9]"
# OSSRT_CUDA_ATTN_SPLIT_KEYS=1024: one attention split a sequence at 1k (10.79 ms once in session 25).
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES="${AB_BATCHES:-256}" TRACE=0 DEADLINE_S=200 \
  VARIANTS="${AB_VARIANTS:--|OSSRT_CUDA_ATTN_SPLIT_KEYS=1024|-|OSSRT_CUDA_ATTN_SPLIT_KEYS=1024}" \
  tools/device/kernel_trace.sh 2>&1 | grep -E "^== var|^mxfp4"
TAG_SUFFIX=_kvfp8 BENCH_FLAGS="--kv-cache-dtype fp8" MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES="256" DEADLINE_S=100 \
  tools/device/kernel_trace.sh 2>&1 | head -24
