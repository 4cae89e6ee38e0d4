#!/usr/bin/env bash
# Why a decode kernel takes its time: `ncu` with its detail sections (speed of light, occupancy,
# launch, warp stall reasons, memory workload, scheduler) on the kernels of one decode-only step of
# `ossrt bench cost` whose names match KERNELS (CUDA graphs on, caches not flushed: as in a real
# step). Complements profile_decode.sh, which only times every kernel. Device call from the repo
# root after tools/device/cuda_pack.sh, carry [".carry/cuda"] (or .carry/cudaz unpacked first).
#
# Usage: [MODEL=gpt-oss-20b] [QUANT=mxfp4] [BATCH=1] [CONTEXT=1024] [COUNT=4] [DEADLINE_S=120]
#        [KERNELS='regex:mxfp4w_moe'] [SKIP=0] [ENVS="VAR=value ..."] tools/device/ncu_kernel_detail.sh
#        (SKIP: matching launches passed over before the COUNT profiled ones)
#        or, for kernels a test binary launches (outside CUDA graphs):
#        TEST="moe_mxfp4_test --gtest_filter=..." [KERNELS=...] [COUNT=...] tools/device/ncu_kernel_detail.sh
# Output: $OUT/ncu_detail_<label>.txt, where label is LABEL (default: batch B).
# Multi-pass sections cannot replay kernels of a graph whose nodes are PDL-launched (ncu fails with
# "Failed to profile"), so for a decode step only single-pass metrics work; the TEST form replays
# kernels launched on a stream.
set -uo pipefail
MODEL=${MODEL:-gpt-oss-20b}
QUANT=${QUANT:-mxfp4}
BATCH=${BATCH:-1}
CONTEXT=${CONTEXT:-1024}
COUNT=${COUNT:-4}
DEADLINE_S=${DEADLINE_S:-120}
KERNELS=${KERNELS:-regex:mxfp4w_moe}
LABEL=${LABEL:-b$BATCH}
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
mkdir -p "$FINAL"
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
NCU=$(command -v ncu || find /usr/local/cuda*/bin /opt -name ncu -type f 2>/dev/null | head -1)
LOG=$FINAL/ncu_detail_$LABEL.txt
# Cycles a warp spends stalled per issued instruction, by reason (what WarpStateStats charts).
STALLS=$(for r in long_scoreboard short_scoreboard wait barrier mio_throttle lg_throttle math_pipe_throttle \
  not_selected selected membar drain no_instruction dispatch_stall sleeping tex_throttle imc_miss; do
  printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' "$r"; done | sed 's/,$//')
echo "== ncu detail: $MODEL $QUANT batch $BATCH, kernels $KERNELS x $COUNT, ${ENVS:-no extra env}, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
NCU_ARGS=(--clock-control none --cache-control none -k "$KERNELS" -s "${SKIP:-0}" -c "$COUNT" --section SpeedOfLight
  --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis
  --section SchedulerStats --metrics "$STALLS" --log-file "$LOG")
if [ -n "${TEST:-}" ]; then
  read -ra test_cmd <<< "$TEST"
  # shellcheck disable=SC2086
  env ${ENVS:-} timeout "$DEADLINE_S" "$NCU" "${NCU_ARGS[@]}" "$PACK/bin/${test_cmd[0]}" "${test_cmd[@]:1}" \
    > /tmp/ncu_detail_$LABEL.log 2>&1
else
  # shellcheck disable=SC2086
  env ${ENVS:-} OSSRT_CUDA_PROFILE_DECODE_STEPS="20:1" timeout "$DEADLINE_S" "$NCU" "${NCU_ARGS[@]}" \
    --profile-from-start off "$PACK/bin/ossrt" bench cost --model "$MODEL" --load-format dummy --backend cuda \
    --quantization "$QUANT" --no-prefill --contexts "$CONTEXT" --batch-sizes "$BATCH" --repeats 1 --no-progress \
    --warmup-steps 23 --decode-steps 2 --result-dir /tmp/ncu_detail_$LABEL > /tmp/ncu_detail_$LABEL.log 2>&1
fi
echo "   ncu exit $?"
# The figures that say where the time goes, per kernel, from the text report.
grep -iE "^  [a-z_0-9]+.*\(|warps_issue_stalled|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size|Waves Per SM|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Stall|L2 Hit|L1/TEX Hit" "$LOG" | head -${LINES_MAX:-200}
