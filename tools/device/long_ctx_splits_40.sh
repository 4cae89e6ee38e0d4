#!/usr/bin/env bash
# Batch-1 decode at 32k: how many splits a full layer's 32k keys should take, on the card that comes
# (~4 min). Session 39's H100 timed one full-layer launch at 32k (attention_test DISABLED_DecodeTiming,
# main 8385436) at 31.8 us with 32 splits (1,024 keys, 256 CTAs: the 4-tile ring) against 35.7 with 64
# (512 keys, 512 CTAs: the 2-tile ring, the default); session 18's H200 (an older kernel) had it the
# other way round (34.4 against 29.5). Issue 16's bar (32k within 15% of 1k at batch 1) is ~1-2% away,
# so the split count is worth measuring on each card in the model, where the neighbours' traffic counts:
#   1. one launch alone: DISABLED_DecodeTiming's 32k rows
#   2. `bench cost` decode steps, 20b `mxfp4-fp8`, batch 1 at 1k and 32k, the cap on splits at 64
#      (default), 32 and 48 (OSSRT_CUDA_ATTN_MAX_SPLITS), 64 with the 3- and 4-tile rings (64 splits
#      are 512 CTAs, past attention_decode_ring's 3 an SM: the default ring there is 2 tiles, one in
#      flight; the 3-tile ring keeps all 512 resident with two in flight; OSSRT_CUDA_ATTN_DECODE_RING)
#      and 32 with the 6-tile ring, alternating; then the caps with an
#      fp8 KV cache (whose ring is always 4)
# If one cap wins on both cards, attention_decode_splits' cap (kAttnMaxDecodeSplits) is the place.
# Device call from the repo root (carry [".carry/cudaz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz && [KV=bf16|fp8] tools/device/long_ctx_splits_40.sh
set -uo pipefail
T0=$(date +%s)
PACK=.carry/cuda
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
source tools/device/pack_env.sh
for i in 1 2; do
  [ "${KV:-both}" = fp8 ] && break
  timeout 60 "$PACK/bin/attention_test" --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_DecodeTiming' 2>&1 |
    grep -E "decode_timing full (32k|1k +keys  128 max_splits  64 grid splits   8 ring 0)" | grep "folded, plain"
done
if [ "${KV:-both}" != fp8 ]; then
BATCHES=1 CONTEXT=1024,32768 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=210 tools/device/decode_ab.sh \
  s64= r3=OSSRT_CUDA_ATTN_DECODE_RING=3 r4=OSSRT_CUDA_ATTN_DECODE_RING=4 s48=OSSRT_CUDA_ATTN_MAX_SPLITS=48 s32=OSSRT_CUDA_ATTN_MAX_SPLITS=32 \
  s32r6=OSSRT_CUDA_ATTN_MAX_SPLITS=32,OSSRT_CUDA_ATTN_DECODE_RING=6 s64b= r3b=OSSRT_CUDA_ATTN_DECODE_RING=3 \
  2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
fi
if [ "${KV:-both}" != bf16 ]; then
BATCHES=1 CONTEXT=1024,32768 MODEL=gpt-oss-20b QUANT=mxfp4-fp8 DEADLINE_S=100 FLAGS="--kv-cache-dtype fp8" \
  tools/device/decode_ab.sh s64= s48=OSSRT_CUDA_ATTN_MAX_SPLITS=48 s32=OSSRT_CUDA_ATTN_MAX_SPLITS=32 s64b= \
  2>&1 | grep -E "^==|^ *mxfp4|exit [^0]"
fi
echo "== done after $(( $(date +%s) - T0 )) s"
