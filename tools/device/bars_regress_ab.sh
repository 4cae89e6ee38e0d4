#!/usr/bin/env bash
# Did batch-1 decode lose speed since session 22? Session 34's serve bars on an H200 put the 120b
# `mxfp4` at 394.5 tok/s a user (404.7 at c55e4cf) and the 20b's 32k at 15.3% slower than 1k (13.7%),
# 3-4 prompts a run on another machine. This times both points with `bench cost` (decode_ab.sh, batch 1),
# this build against an older one in the same pack, interleaved: 120b mxfp4 at 1k, then 20b mxfp4-fp8
# at 32k and 1k. The old build's switches that became defaults later are exported for it.
# Pack: XZ=1 EXTRA_BINARIES="/path/to/old/build-cuda/ossrt renamed ossrt_old" tools/device/cuda_pack.sh
#   (e.g. git worktree add /work/wt-old c55e4cf; cmake -S /work/wt-old -B /work/wt-old/build-cuda -G Ninja
#    -DOSSRT_CUDA=ON; ninja -C /work/wt-old/build-cuda ossrt; cp .../ossrt /tmp/old/ossrt_old: ~10 min)
# Device call from the repo root, carry [".carry/cudaz"]:
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && [OLD_BIN=ossrt_old] tools/device/bars_regress_ab.sh
# ~5 min on an H200 (a 120b dummy load is ~30 s).
set -uo pipefail
OLD="OSSRT_AB_BIN=${OLD_BIN:-ossrt_old},OSSRT_CUDA_QKV_NORM_FOLD=1,OSSRT_CUDA_FUSED_GREEDY=1,OSSRT_CUDA_GREEDY_SCREEN=1"
export BATCHES=1
show() { grep -E "^==|exit|ITL|^ *mxfp4"; }
MODEL=gpt-oss-120b QUANT=mxfp4 CONTEXT=1024 DEADLINE_S=170 tools/device/decode_ab.sh new= old="$OLD" new2= old2="$OLD" 2>&1 | show
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=32768 DEADLINE_S=100 tools/device/decode_ab.sh new= old="$OLD" new2= old2="$OLD" 2>&1 | show
MODEL=gpt-oss-20b QUANT=mxfp4-fp8 CONTEXT=1024 DEADLINE_S=60 tools/device/decode_ab.sh new= old="$OLD" 2>&1 | show
