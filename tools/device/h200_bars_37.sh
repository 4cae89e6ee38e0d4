#!/usr/bin/env bash
# The H200's issue bars in one call (~8 min), after the GPU suite passed on the same pack:
#   1. serve_bars.sh PARTS="120b 20b": one stream through `ossrt serve` (issue 15: 120b `mxfp4` 400 tok/s
#      a user at least; issue 16: 20b `mxfp4-fp8` decode at 32k within 15% of 1k)
#   2. serve_c256_knobs.sh with the defaults and `--kv-cache-dtype fp8` (issue 16: 20,000 out tok/s at 256
#      concurrent 1k/1k requests)
# Prefix a developer switch to measure it everywhere, e.g. OSSRT_CUDA_MOE_SMALL_M_ROWS=16.
# Device call from the repo root (carry [".carry/cudaz", ".carry/tokgz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/h200_bars_37.sh
set -uo pipefail
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
PARTS="${PARTS:-120b 20b}" tools/device/serve_bars.sh 2>&1 | grep -E "^==|tok/s a user|slower than|!!"
echo "== serve bars done after $(( $(date +%s) - T0 )) s"
VARIANTS="${VARIANTS:--|--kv-cache-dtype fp8}" EACH_S="${EACH_S:-80}" tools/device/serve_c256_knobs.sh 2>&1 |
  grep -vE "^$"
echo "== done after $(( $(date +%s) - T0 )) s"
