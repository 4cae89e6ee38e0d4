#!/usr/bin/env bash
# The 256-sequence decode step and the MXFP4 pipe's narrow-tile shapes (docs/kernels.md, "A 256-sequence
# decode step"): both narrow shapes (two 64-row sets a consumer warp, the default; one set with
# OSSRT_CUDA_MOE_PIPE_SETS=1) bit for bit against the ring kernels, both shapes' gate_up under ncu's
# source counters, step times of both interleaved with one split a sequence for the decode attention
# (bench cost, TRACE=0), and a trace with the fp8 KV cache.
# Device call from the repo root, pack unpacked into .carry/cuda. Usage: tools/device/step256_probe.sh
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== both narrow shapes (one and two 64-row sets a consumer warp), bit for bit against the ring kernels"
timeout 150 "$PACK/bin/moe_mxfp4_test" --gtest_filter='*Narrow*:*WgmmaPipeIsTheRing*:*ThirtyTwo*' 2>&1 |
  grep -E "^\[ +(OK|FAILED|PASSED) |Failure|differ" | head -40
for skip in 2 3; do  # gate_up at 48-row tiles of the test's E = 32, T = 256 case: one set (2), two sets (3)
  TEST="moe_mxfp4_test --gtest_filter=*NarrowTilesAreTheRing*" KERNELS='regex:gate_up_swiglu_wgmma_pipe' \
    SKIP=$skip LABEL=gate_up48_skip$skip tools/device/ncu_sass.sh 2>&1 |
    grep -E "^== |ncu exit|Duration|Issued Warp|Executed Ipc|instructions [0-9]"
done
# Interleaved, twice: the spread of one run is ~2% (11.05 against 11.30 ms for the same binary).
# OSSRT_CUDA_ATTN_SPLIT_KEYS=1024: one split a sequence at 1k (10.79 ms once in session 25).
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES="${AB_BATCHES:-256}" TRACE=0 DEADLINE_S=200 \
  VARIANTS="${AB_VARIANTS:--|OSSRT_CUDA_MOE_PIPE_SETS=1|OSSRT_CUDA_ATTN_SPLIT_KEYS=1024|-|OSSRT_CUDA_MOE_PIPE_SETS=1|OSSRT_CUDA_ATTN_SPLIT_KEYS=1024}" \
  tools/device/kernel_trace.sh 2>&1 | grep -E "^== var|^mxfp4"
TAG_SUFFIX=_kvfp8 BENCH_FLAGS="--kv-cache-dtype fp8" MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES="256" DEADLINE_S=100 \
  tools/device/kernel_trace.sh 2>&1 | head -12
