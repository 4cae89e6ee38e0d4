#!/usr/bin/env bash
# Branch next/attn-b1 before it merges (the decode attention's plain-step form: 120b `mxfp4` batch 1
# 2.76 ms against 2.95-2.98 with the generic form, H100, session 36; its GPU suite did not fit in that
# session's budget): the whole GPU suite, then the 120b through `ossrt serve` at one stream (issue 15's
# floor: 400 tok/s a user on an H200; 394.5 in session 34), then the 20b one-stream 1k / 32k bar
# (issue 16: 32k within 15% of 1k) if time is left. ~8 min on an H200.
# Device call from the repo root: tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/attn_plain_suite_37.sh
set -uo pipefail
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
TEST_S=210 tools/device/gpu_tests_parallel.sh 2>&1 | tail -26
echo "== suite done after $(( $(date +%s) - T0 )) s"
PARTS=120b tools/device/serve_bars.sh 2>&1 | grep -E "^==|tok/s a user|slower|exit"
[ $(( $(date +%s) - T0 )) -lt 400 ] && PARTS=20b tools/device/serve_bars.sh 2>&1 | grep -E "^==|tok/s a user|slower|exit"
echo "== done after $(( $(date +%s) - T0 )) s"
