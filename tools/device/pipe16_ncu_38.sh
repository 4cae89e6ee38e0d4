#!/usr/bin/env bash
# Why the MXFP4 pipe's 16-row route tiles lose to 32-row ones on the 20b's 32 experts at 5 rows an
# expert (session 38: 7.97 against 7.01 ms a 40-sequence step): one decode step of `bench cost` under
# ncu (kernel times only) with each tile forced, tables by tools/device/ncu_step_table.py.
# Device call from the repo root (carry [".carry/cudaz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && tools/device/pipe16_ncu_38.sh
set -uo pipefail
T0=$(date +%s)
source tools/device/pack_env.sh  # PACK, LD_LIBRARY_PATH
NCU=$(command -v ncu || find /usr/local/cuda*/bin /opt -name ncu -type f 2>/dev/null | head -1)
FINAL=${OUT:-/tmp/ossrt-out}; mkdir -p "$FINAL"
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(tr '\n' ' ' < "$PACK/COMMIT")"
for tile in 16 32; do
  OSSRT_CUDA_MOE_WGMMA_TILE=$tile OSSRT_CUDA_PROFILE_DECODE_STEPS="6:1" timeout 75 "$NCU" --clock-control none \
    --cache-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    --log-file "$FINAL/ncu_t$tile.csv" "$PACK/bin/ossrt" bench cost --model gpt-oss-20b --load-format dummy \
    --backend cuda --quantization mxfp4-fp8 --no-prefill --contexts 1024 --batch-sizes 40 --repeats 1 --no-progress \
    --warmup-steps 8 --decode-steps 2 --result-dir /tmp/ncu_t$tile > /tmp/ncu_t$tile.log 2>&1
  echo "== tile $tile: ncu exit $? after $(( $(date +%s) - T0 )) s"
  python3 tools/device/ncu_step_table.py "$FINAL/ncu_t$tile.csv" --steps 1 --title "20b b40 tile $tile" 2>&1 | head -16
done
