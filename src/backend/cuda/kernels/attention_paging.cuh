#pragma once
// Device-side view of one sequence's keys in the paged cache, shared by the prefill and decode
// attention kernels: visible range of a query position and the block-table lookup.
#include <cstdint>

#include "backend/cuda/kernels/attention.cuh"

namespace ossrt::cuda {

// Keys [lo, hi] a query at position pos may see (docs/reference/SPEC.md 2.4: j <= pos and pos - j < window).
__device__ __forceinline__ int first_visible_key(int pos, int window) {
  return window > 0 ? max(0, pos - window + 1) : 0;
}

// The pool block holding logical block `logical` of the sequence's table for this layer's group, or -1
// when the table does not cover it or names a block outside the pool: such keys are masked, never read.
__device__ __forceinline__ int kv_block_of(const AttentionArgs& a, const SeqStep& seq, int logical) {
  int idx, len;
  const int32_t* table;
  if (a.sliding) {
    // The window table starts at logical block window_first_block (older blocks are released).
    idx = logical - seq.window_first_block;
    len = seq.window_table_len;
    table = a.plan.window_block_table + seq.window_table_begin;
  } else {
    idx = logical;
    len = seq.full_table_len;
    table = a.plan.full_block_table + seq.full_table_begin;
  }
  if (idx < 0 || idx >= len) return -1;
  const int block = table[idx];
  return block < 0 || block >= a.num_blocks ? -1 : block;
}

// Element offset of key j's row (K or V, same layout) for KV head kv_head in pool block `block` (its
// logical block's), or -1 for block -1. `bs` is the plan's block size (a caller built for one size
// passes it as a constant, so the division folds away).
__device__ __forceinline__ int64_t kv_row_offset_in(const AttentionArgs& a, int kv_head, int block, int j, int bs) {
  if (block < 0) return -1;
  return ((int64_t(block) * a.num_kv_heads + kv_head) * bs + j % bs) * kAttnHeadDim;
}

// Element offset of key j's row for KV head kv_head, or -1 when its block is not in the table or pool.
__device__ __forceinline__ int64_t kv_row_offset(const AttentionArgs& a, const SeqStep& seq, int kv_head, int j,
                                                 int bs) {
  return kv_row_offset_in(a, kv_head, kv_block_of(a, seq, j / bs), j, bs);
}
// The same with the plan's block size read from the arguments.
__device__ __forceinline__ int64_t kv_row_offset(const AttentionArgs& a, const SeqStep& seq, int kv_head, int j) {
  return kv_row_offset(a, seq, kv_head, j, a.plan.block_size);
}

}  // namespace ossrt::cuda
