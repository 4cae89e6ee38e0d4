#!/usr/bin/env bash
# Where did batch 1 lose ~2.5% since session 22 (docs/kernels.md, "Known limits")? The 120b `mxfp4` at
# 1k context, `bench cost` step times, alternated:
#   new   this build;
#   old   c55e4cf's (packed as `ossrt_old` with cuda_pack.sh's EXTRA_BINARIES), today's defaults exported;
#   attn  this build with c55e4cf's decode attention kernel (packed as `ossrt_attn_c55`: the file
#         swapped in, /work/notes/b1_regress/attention_decode.c55e4cf_shim.cu on the CPU machine);
# each with the greedy screen off too (`*_ns`: OSSRT_CUDA_GREEDY_SCREEN=0), because the screen's
# rescore is the one data-dependent cost of a step, and dummy-weight greedy tokens differ between
# builds whose attention rounds differently (a second reader's hypothesis). Then the kernel tracer on
# new and old (what each kernel adds), and the 20b `mxfp4-fp8` batch-1 32k split/ring variants.
# ~9 min on an H200. Device call from the repo root, the pack unpacked into .carry/cuda:
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/b1_regress_trace.sh
set -uo pipefail
T0=$(date +%s)
OLD="OSSRT_AB_BIN=ossrt_old,OSSRT_CUDA_QKV_NORM_FOLD=1,OSSRT_CUDA_FUSED_GREEDY=1"
ATTN=OSSRT_AB_BIN=ossrt_attn_c55
NS=OSSRT_CUDA_GREEDY_SCREEN=0
show() { grep -E "^==|exit|ITL|^ *mxfp4"; }
nvidia-smi --query-gpu=name --format=csv,noheader
BATCHES=1 MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=1024 DEADLINE_S=300 tools/device/decode_ab.sh \
  new= old="$OLD,OSSRT_CUDA_GREEDY_SCREEN=1" attn="$ATTN" new_ns="$NS" old_ns="$OLD,$NS" attn_ns="$ATTN,$NS" \
  new2= old2="$OLD,OSSRT_CUDA_GREEDY_SCREEN=1" 2>&1 | show
OLDT="OSSRT_AB_BIN=ossrt_old OSSRT_CUDA_QKV_NORM_FOLD=1 OSSRT_CUDA_FUSED_GREEDY=1 OSSRT_CUDA_GREEDY_SCREEN=1"
[ $(( $(date +%s) - T0 )) -lt 420 ] && MODEL=gpt-oss-120b QUANT=mxfp4 BATCHES=1 DEADLINE_S=100 VARIANTS="-|$OLDT" \
  tools/device/kernel_trace.sh 2>&1 | grep -vE "^ +[0-9]+ " | head -60
[ $(( $(date +%s) - T0 )) -lt 480 ] && DEADLINE_S=90 tools/device/attn_32k_b1_variants.sh
echo "== done after $(( $(date +%s) - T0 )) s"
