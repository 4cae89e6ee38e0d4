#!/usr/bin/env bash
# Batch-1 decode at 32k: the decode attention's split count and ring depth (issue 16: 32k within 15%
# of 1k). At one sequence and 32k keys the launcher picks 64 splits of 512 keys (512 CTAs, more than
# 3 an SM) and so the 2-tile ring; the variants trade splits for ring depth so that every CTA is
# resident in one wave: 48 splits x ring 4 (384 CTAs, 3 an SM), 32 x ring 6 (256 CTAs, 2 an SM), and
# 64 x ring 4 (two waves), `bench cost` batch 1 with the default first and last (drift check).
# Device call from the repo root after the pack is unpacked into .carry/cuda.
# Usage: [QUANT=mxfp4-fp8] [CONTEXT=32768] tools/device/attn_32k_b1_variants.sh
set -uo pipefail
export MODEL=${MODEL:-gpt-oss-20b} QUANT=${QUANT:-mxfp4-fp8} CONTEXT=${CONTEXT:-32768} BATCHES=1 DEADLINE_S=${DEADLINE_S:-170}
tools/device/decode_ab.sh base= \
  s48r4=OSSRT_CUDA_ATTN_MAX_SPLITS=48,OSSRT_CUDA_ATTN_DECODE_RING=4 \
  s32r6=OSSRT_CUDA_ATTN_MAX_SPLITS=32,OSSRT_CUDA_ATTN_DECODE_RING=6 \
  s64r4=OSSRT_CUDA_ATTN_DECODE_RING=4 \
  base2= 2>&1 | grep -E "^==|exit|ITL|^ *mxfp4"
