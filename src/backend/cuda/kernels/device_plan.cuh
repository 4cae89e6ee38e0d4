#pragma once
// DevicePlan: the StepPlan as the kernels see it. CudaBackend::begin_step uploads the plan's arrays
// once per step into fixed device buffers (fixed so CUDA graphs captured for a decode bucket keep
// reading the same addresses) and fills this POD; every kernel that needs positions, slots or block
// tables receives it by value inside its argument struct. Host-side scalars (num_tokens, ...) size
// the grids; kernels re-read per-sequence facts from the device arrays, so a replayed graph sees the
// current step's contexts.
#include <cstdint>

#include "backend/step_plan.h"

namespace ossrt::cuda {

struct DevicePlan {
  // ---- host scalars (grid sizing)
  int num_tokens = 0;      // T: rows of the step's activations
  int num_seqs = 0;        // sequences in the step (padded decode buckets count padded ones)
  int block_size = 16;     // tokens per KV block, both groups
  int max_context = 0;     // largest context_begin + num_tokens of any sequence (an upper bound is fine)
  int max_seq_tokens = 0;  // largest SeqStep::num_tokens of any sequence (1 for decode-only steps)

  // ---- device arrays (all int32, uploaded verbatim from the StepPlan)
  const int32_t* token_ids = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* token_seq = nullptr;     // [num_tokens]
  const int32_t* full_slots = nullptr;    // [num_tokens]
  const int32_t* window_slots = nullptr;  // [num_tokens]
  // [num_seqs] SeqStep records uploaded as-is (SeqStep is 8 x int32, standard layout), so the
  // fields token_begin, num_tokens, context_begin, full_table_begin/len, window_table_begin/len,
  // window_first_block are read straight from them.
  const SeqStep* seqs = nullptr;
  const int32_t* full_block_table = nullptr;    // flattened, indexed via SeqStep::full_table_begin
  const int32_t* window_block_table = nullptr;  // flattened, indexed via SeqStep::window_table_begin
  const int32_t* logit_rows = nullptr;          // [num_logit_rows]
  int num_logit_rows = 0;
  // Steps whose sequences run 2 to kTokenSeqsMaxTokens tokens (speculative verify steps, short
  // chunks): one SeqStep per token row, as if each row were a decode sequence of its own (its
  // context_begin = its position, num_tokens 1, its sequence's block tables), so the split-KV decode
  // attention serves them (CudaBackend::attention). num_token_seqs = num_tokens then, else 0.
  const SeqStep* token_seqs = nullptr;  // [num_tokens]
  int num_token_seqs = 0;
  // [1]: num_tokens - StepPlan::padding_tokens, the rows before a graph bucket's padding (uploaded
  // every step, so a graph captured at one count replays at another).
  const int32_t* real_tokens = nullptr;
};

inline constexpr int kTokenSeqsMaxTokens = 8;

static_assert(sizeof(SeqStep) == 8 * sizeof(int32_t), "SeqStep is uploaded verbatim as 8 int32");

}  // namespace ossrt::cuda
