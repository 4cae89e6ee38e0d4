#!/usr/bin/env bash
# A/B of prefill latency: `ossrt bench cost` (dummy weights, one prompt at a time, the median of
# --repeats after a warm-up, no decode points) at the given prompt lengths once per variant, a variant
# being environment settings for the ossrt process (developer switches such as
# OSSRT_CUDA_MOE_WGMMA=0, docs/kernels.md). Prints each variant's prefill table; the JSONs
# (prefill_<label>.json) land in one tarball, $OUT/ab_<start time>_<pid>.tgz (ab_common.sh). Device
# call from the repo root after tools/device/cuda_pack.sh, carry [".carry/cuda"] (or the compressed
# .carry/cudaz unpacked first).
#
# Usage: [MODEL=gpt-oss-20b] [QUANT=mxfp4-fp8] [INPUT_LENS="1024 8192"] [REPEATS=3] [DEADLINE_S=200]
#        tools/device/prefill_ab.sh label=VAR=value[,VAR=value] ...   (label=  with no settings: as is;
#        BIN=ossrt_old among the settings runs that binary of the pack instead of ossrt)
set -uo pipefail
MODEL=${MODEL:-gpt-oss-20b}
QUANT=${QUANT:-mxfp4-fp8}
INPUT_LENS=${INPUT_LENS:-1024 8192}
REPEATS=${REPEATS:-3}
DEADLINE_S=${DEADLINE_S:-200}
source "$(pwd)/tools/device/ab_common.sh"  # START, ROOT, PACK, FINAL, left, ab_variant, ab_done
echo "== prefill A/B: $MODEL $QUANT, prompts $INPUT_LENS, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
LENS=$(echo "$INPUT_LENS" | tr ' ' ',')
for variant in "$@"; do
  ab_variant "$variant" || continue
  bin=ossrt  # BIN=ossrt_old in a variant's settings: an older build's binary (cuda_pack.sh EXTRA_BINARIES)
  for e in "${envs[@]}"; do case $e in BIN=*) bin=${e#BIN=} ;; esac; done
  env "${envs[@]}" timeout "$(left)" "$PACK/bin/$bin" bench cost --model "$MODEL" --load-format dummy --backend cuda \
    --quantization "$QUANT" --input-lens "$LENS" --repeats "$REPEATS" --no-decode --no-progress \
    --result-dir "/tmp/pf_$label" > "/tmp/pf_$label.log" 2>&1
  echo "   exit $?"
  grep -A6 "^Prefill:" "/tmp/pf_$label.log"
  cp /tmp/pf_"$label"/*.json "$FINAL/prefill_$label.json" 2>/dev/null && ab_keep "prefill_$label.json"
done
ab_done
