#pragma once
// Which step plans a captured graph can replay, and those plans padded to the graph's shape.
// Host-only (no CUDA), so the CPU build tests it (tests/unit/backend_graph_plan_test.cpp); the CUDA
// backend's graph cache (backend/cuda/cuda_graphs.h) keys and pads with it.
//
// A graph fixes every grid and every size the host hands a kernel, so the plans one graph replays
// must agree in everything the host reads from them: token rows, sequences, tokens per sequence,
// logit rows. Two kinds of steps come as B sequences of T tokens each, every row's logits in order:
//   decode  T = 1: each sequence's newest token;
//   verify  T = 1 + k: the newest token and k guesses of a drafter (docs/engine.md, "Speculative
//           decoding"), every one of them a logit row.
// Padding B up to a batch bucket with dummy sequences of T tokens each gives few shapes that serve
// every such step. Anything else (prefill chunks, mixed steps, a verify step whose sequences carry
// different numbers of guesses) runs eagerly: padding a sequence with fewer guesses to T would
// change what the model computes for it.
#include <compare>

#include "backend/step_plan.h"

namespace ossrt {

// 1, 2, 4, ..., 512: vLLM's largest --max-num-seqs default.
inline constexpr int kGraphBatchBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
// The most tokens a sequence of a graphed step runs: 1 + the 16 guesses --speculative-config allows
// (engine/drafter.cpp). Plans that ask for every row of a longer chunk (`ossrt logits`, tests) stay
// eager rather than capture one graph per length.
inline constexpr int kMaxGraphSeqTokens = 17;
inline constexpr int kMinGraphContextBucket = 1024;

// What a graph is captured for. The padded plan has batch_bucket * seq_tokens token rows and as many
// logit rows.
struct GraphKey {
  int batch_bucket = 0;    // sequences after padding
  int seq_tokens = 0;      // T: tokens, and logit rows, of every sequence
  int context_bucket = 0;  // graph_context_bucket(max_context), or 0 where no launch depends on it
  // StepPlan::greedy_ids_only, where the backend's launches depend on it (else false).
  bool greedy_ids_only = false;
  int rows() const { return batch_bucket * seq_tokens; }
  auto operator<=>(const GraphKey&) const = default;
};

// Smallest bucket >= n, or 0 when n is larger than every bucket.
int graph_batch_bucket(int n);
// Smallest power of two >= max(n, kMinGraphContextBucket).
int graph_context_bucket(int n);

// T when `plan` has the shape above: at least one sequence; sequence i runs T tokens
// (1 <= T <= kMaxGraphSeqTokens) at rows [i T, (i + 1) T); logit_rows = 0, 1, ..., B T - 1. Else 0.
int uniform_seq_tokens(const StepPlan& plan);

// The key of such a plan (context bucket filled in), or batch_bucket 0 when it has no key: not
// uniform, or more sequences than the largest bucket.
GraphKey graph_key(const StepPlan& plan);

// `plan` (uniform with T tokens a sequence) padded to `bucket` sequences. A padded sequence runs T
// tokens of id 0 at positions 0..T-1 whose K/V go to, and come from, only block `full_scratch` of the
// full pool and `window_scratch` of the window pool (listed once per block its positions span); its
// rows are logit rows too, after the real ones, so the real rows keep their indices.
StepPlan pad_plan_to_bucket(const StepPlan& plan, int bucket, int full_scratch, int window_scratch);

}  // namespace ossrt
