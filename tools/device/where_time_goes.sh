#!/usr/bin/env bash
# Where issue 16's remaining time goes (docs/kernels.md, "The wide pipe at 8k, ablated"): kernel
# traces of one 8k prompt's prefill and of 256-sequence decode steps at serve's contexts (2k), then the
# decode attention kernel at 256 sequences under ncu's source counters (ossrt bench kernels' launch,
# not a graph's). Device call from the repo root, pack unpacked into .carry/cuda (XZ=1 pack: the tracer).
# Usage: [CONTEXT=2048] tools/device/where_time_goes.sh
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
nvidia-smi --query-gpu=name --format=csv,noheader
TAG_SUFFIX=_prefill8k PREFILL=8192 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=120 \
  tools/device/kernel_trace.sh 2>&1 | head -40
TAG_SUFFIX=_ctx${CONTEXT:-2048} CONTEXT=${CONTEXT:-2048} MODEL=gpt-oss-20b QUANT=mxfp4-fp8 BATCHES=256 DEADLINE_S=120 \
  tools/device/kernel_trace.sh 2>&1 | head -30
TEST="ossrt bench kernels --models gpt-oss-20b --ops attention_full --decode-tokens 256 --prefill-tokens 1024 --decode-context ${CONTEXT:-2048}" \
  KERNELS='regex:sdpa_sinks_d64_decode<' SKIP=3 LABEL=attn_decode256 tools/device/ncu_sass.sh 2>&1 |
  grep -E "^== |ncu exit|Duration|DRAM Throughput|Issued Warp|Eligible|Executed Ipc|instructions [0-9]|Stall|^ +[0-9.]+%" | head -50
