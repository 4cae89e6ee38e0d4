#!/usr/bin/env bash
# Why a decode kernel takes its time: `ncu` with its detail sections (speed of light, occupancy,
# launch, warp stall reasons, memory workload, scheduler) on the kernels of one decode-only step of
# `ossrt bench cost` whose names match KERNELS (CUDA graphs on, caches not flushed: as in a real
# step). Complements profile_decode.sh, which only times every kernel. Device call from the repo
# root after tools/device/cuda_pack.sh, carry [".carry/cuda"] (or .carry/cudaz unpacked first).
#
# Usage: [MODEL=gpt-oss-20b] [QUANT=mxfp4] [BATCH=1] [CONTEXT=1024] [COUNT=4] [DEADLINE_S=120]
#        [KERNELS='regex:mxfp4w_moe'] [ENVS="VAR=value ..."] tools/device/ncu_kernel_detail.sh
# Output: $OUT/ncu_detail_<label>.txt, where label is LABEL (default: batch B).
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
CUBLAS_DIR=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)")
NCCL_DIR=$(dirname "$(find /usr /opt -maxdepth 9 -name 'libnccl.so.2*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$PACK/lib:$CUBLAS_DIR:$NCCL_DIR:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || find /usr/local/cuda*/bin /opt -name ncu -type f 2>/dev/null | head -1)
LOG=$FINAL/ncu_detail_$LABEL.txt
# Cycles a warp spends stalled per issued instruction, by reason (what WarpStateStats charts).
STALLS=$(for r in long_scoreboard short_scoreboard wait barrier mio_throttle lg_throttle math_pipe_throttle \
  not_selected selected membar drain no_instruction dispatch_stall sleeping tex_throttle imc_miss; do
  printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' "$r"; done | sed 's/,$//')
echo "== ncu detail: $MODEL $QUANT batch $BATCH, kernels $KERNELS x $COUNT, ${ENVS:-no extra env}, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
# shellcheck disable=SC2086
env ${ENVS:-} OSSRT_CUDA_PROFILE_DECODE_STEPS="20:1" timeout "$DEADLINE_S" "$NCU" --clock-control none \
  --cache-control none --profile-from-start off -k "$KERNELS" -c "$COUNT" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats --log-file "$LOG" --metrics "$STALLS" \
  "$PACK/bin/ossrt" bench cost --model "$MODEL" --load-format dummy --backend cuda --quantization "$QUANT" \
  --no-prefill --contexts "$CONTEXT" --batch-sizes "$BATCH" --repeats 1 --no-progress --warmup-steps 23 \
  --decode-steps 2 --result-dir /tmp/ncu_detail_$LABEL > /tmp/ncu_detail_$LABEL.log 2>&1
echo "   ncu exit $?"
# The figures that say where the time goes, per kernel, from the text report.
grep -iE "^  [a-z_0-9]+.*\(|warps_issue_stalled|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size|Waves Per SM|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Stall|L2 Hit|L1/TEX Hit" "$LOG" | head -${LINES_MAX:-200}
