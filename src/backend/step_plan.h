#pragma once
// StepPlan: everything one forward step needs to know about which tokens run where, built once per
// step by the scheduler (or by a simple runner for `ossrt logits`), uploaded once by
// Backend::begin_step, and used by every layer. No layer recomputes any of it.
//
// KV cache geometry. Two layer groups keep separate block pools:
//   full layers    : every position of a sequence, paged in blocks of `block_size` tokens;
//   sliding layers : the same paging, but blocks wholly older than the window are released, so a
//                    sequence holds only the blocks that cover its last `sliding_window` positions
//                    (plus the current step's tokens). Their block table is therefore a window:
//                    window_block_table[j] holds logical block (window_first_block + j).
// Storage per layer and pool is [num_blocks][num_kv_heads][block_size][head_dim] for K and for V.
#include <cstdint>
#include <vector>

namespace ossrt {

enum class KvGroup : uint8_t { Full = 0, Sliding = 1 };

struct SeqStep {
  int32_t token_begin = 0;    // first row of this sequence's tokens in the step's token arrays
  int32_t num_tokens = 0;     // query tokens this step (prefill chunk length, or 1 for decode)
  int32_t context_begin = 0;  // absolute position of the first query token = tokens already cached
  // Offsets into the flattened block tables below.
  int32_t full_table_begin = 0;
  int32_t full_table_len = 0;  // covers positions [0, context_begin + num_tokens)
  int32_t window_table_begin = 0;
  int32_t window_table_len = 0;
  int32_t window_first_block = 0;  // logical block index of window_block_table[window_table_begin]
};

struct StepPlan {
  int block_size = 16;
  std::vector<int32_t> token_ids;  // [T]
  std::vector<int32_t> positions;  // [T] absolute positions
  std::vector<int32_t> token_seq;  // [T] index into seqs
  // Where each token's K/V is written: block_id * block_size + offset_in_block, per group. [T]
  std::vector<int32_t> full_slots;
  std::vector<int32_t> window_slots;
  std::vector<SeqStep> seqs;
  std::vector<int32_t> full_block_table;
  std::vector<int32_t> window_block_table;
  // Token rows whose logits this step returns, in output order (usually the last token of every
  // sequence that samples; every row for `ossrt logits`). [R]
  std::vector<int32_t> logit_rows;
  // Every logit row is sampled greedily (argmax, lowest id on ties) and nothing but its id is wanted:
  // no token mask, logprobs, logit changes or host sampling (the engine sets it; engine/step_sampling.h
  // only_greedy_ids). A backend may then find the ids without writing all the logits (the CUDA
  // backend's greedy screen, docs/cuda_backend.md); the logits it returns must then not be read.
  bool greedy_ids_only = false;
  // Rows at the end that no caller asked for: pad_plan_to_bucket's scratch sequences, which fill a
  // CUDA graph's batch bucket. Every op still computes them (their outputs are never read), but the
  // MoE routes them to no expert: identical rows, they would all pick the same top-k experts and
  // crowd those experts' tiles (docs/cuda_backend.md, "CUDA graphs").
  int32_t padding_tokens = 0;

  int num_tokens() const { return int(token_ids.size()); }
  int num_seqs() const { return int(seqs.size()); }
  // Largest context (cached + new) of any sequence in the step.
  int max_context() const;
  // True when every sequence runs exactly one token (a decode-only step; CUDA graphs replay these).
  bool is_decode_only() const;
};

}  // namespace ossrt
