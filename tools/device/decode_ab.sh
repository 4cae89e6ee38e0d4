#!/usr/bin/env bash
# A/B of decode-step time: `ossrt bench cost` (dummy weights, CUDA graphs, no prefill) at the given
# batch sizes once per variant, a variant being environment settings for the ossrt process (e.g. the
# developer switches OSSRT_CUDA_GEMV_MAX_ROWS=0 of docs/kernels.md). Prints each variant's ITL line
# and the JSONs (ab_<label>.json) land in one tarball, $OUT/ab_<start time>_<pid>.tgz (AB_BUNDLE
# names it; ab_common.sh). Device call from the repo root after tools/device/cuda_pack.sh, carry
# [".carry/cuda"].
#
# Usage: [MODEL=gpt-oss-20b] [QUANT=mxfp4] [BATCHES="1 8 64"] [CONTEXT=1024] [DEADLINE_S=200]
#        [FLAGS="--kv-cache-dtype fp8"] tools/device/decode_ab.sh label=VAR=value[,VAR=value] ...   (label=  with no settings: as is)
# The setting OSSRT_AB_BIN=name runs $PACK/bin/name instead of ossrt (a second build packed with
# cuda_pack.sh's EXTRA_BINARIES, for kernels that have no switch: A and B in the same call).
# FLAGS: more `bench cost` flags for every variant, split on spaces.
set -uo pipefail
MODEL=${MODEL:-gpt-oss-20b}
QUANT=${QUANT:-mxfp4}
BATCHES=${BATCHES:-1 8 64}
CONTEXT=${CONTEXT:-1024}
DEADLINE_S=${DEADLINE_S:-200}
source "$(pwd)/tools/device/ab_common.sh"  # START, ROOT, PACK, FINAL, left, ab_variant, ab_done
echo "== decode A/B: $MODEL $QUANT, batches $BATCHES, context $CONTEXT ${FLAGS:-}, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
BATCH_LIST=$(echo "$BATCHES" | tr ' ' ',')
extra=(); [ -n "${FLAGS:-}" ] && read -ra extra <<< "$FLAGS"
for variant in "$@"; do
  ab_variant "$variant" || continue
  bin=ossrt
  for e in "${envs[@]}"; do case $e in OSSRT_AB_BIN=*) bin=${e#OSSRT_AB_BIN=} ;; esac; done
  env "${envs[@]}" timeout "$(left)" "$PACK/bin/$bin" bench cost --model "$MODEL" --load-format dummy --backend cuda \
    --quantization "$QUANT" --no-prefill --contexts "$CONTEXT" --batch-sizes "$BATCH_LIST" --repeats 1 --no-progress \
    --warmup-steps 5 --decode-steps 40 "${extra[@]}" --result-dir "/tmp/ab_$label" > "/tmp/ab_$label.log" 2>&1
  echo "   exit $?"
  grep -B1 -A6 "ITL ms" "/tmp/ab_$label.log" | head -14
  grep -o "step timing.*" "/tmp/ab_$label.log"  # with OSSRT_CUDA_STEP_TIMING=1 (step_timing.h)
  cp /tmp/ab_"$label"/*.json "$FINAL/ab_$label.json" 2>/dev/null && ab_keep "ab_$label.json"
done
ab_done
