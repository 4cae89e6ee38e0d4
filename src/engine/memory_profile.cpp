#include "engine/memory_profile.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace ossrt {

ProfileStep make_profile_step(int max_num_batched_tokens, int max_num_seqs, int block_size, int vocab_size) {
  OSSRT_CHECK(max_num_batched_tokens > 0 && max_num_seqs > 0 && block_size > 0 && vocab_size > 0,
              "profile step: {} tokens, {} sequences, block size {}", max_num_batched_tokens, max_num_seqs, block_size);
  ProfileStep p;
  StepPlan& plan = p.plan;
  plan.block_size = block_size;
  const int seqs = std::min(max_num_seqs, max_num_batched_tokens);
  int block = 0;
  for (int s = 0; s < seqs; ++s) {
    const int n = s + 1 < seqs ? 1 : max_num_batched_tokens - (seqs - 1);
    const int blocks = (n + block_size - 1) / block_size;
    SeqStep seq;
    seq.token_begin = plan.num_tokens();
    seq.num_tokens = n;
    seq.context_begin = 0;
    seq.full_table_begin = int(plan.full_block_table.size());
    seq.full_table_len = blocks;
    seq.window_table_begin = int(plan.window_block_table.size());
    seq.window_table_len = blocks;
    seq.window_first_block = 0;
    for (int b = 0; b < blocks; ++b) {
      plan.full_block_table.push_back(block + b);
      plan.window_block_table.push_back(block + b);
    }
    for (int i = 0; i < n; ++i) {
      // Any valid ids do; spread them so no step is a run of one token.
      plan.token_ids.push_back(int32_t((uint64_t(s) * 7919u + uint64_t(i) * 104729u) % uint64_t(vocab_size)));
      plan.positions.push_back(i);
      plan.token_seq.push_back(s);
      const int slot = (block + i / block_size) * block_size + i % block_size;
      plan.full_slots.push_back(slot);
      plan.window_slots.push_back(slot);
    }
    plan.logit_rows.push_back(seq.token_begin + n - 1);
    plan.seqs.push_back(seq);
    block += blocks;
  }
  p.full_blocks = block;
  p.window_blocks = block;
  return p;
}

size_t kv_budget_after_profile(const MemoryUse& m, double utilization) {
  const double in_use_without_profile_kv = double(m.in_use) - double(std::min(m.kv_cache, m.in_use));
  const double budget = utilization * double(m.capacity) - in_use_without_profile_kv - double(m.reserve);
  return budget > 0 ? size_t(budget) : 0;
}

std::string MemoryReport::one_line() const {
  auto gib = [](size_t bytes) { return double(bytes) / double(size_t(1) << 30); };
  std::string source = profiled ? fmt::format("{:.2f} x {:.1f} GiB, profiled at {} tokens / {} sequences", utilization,
                                              gib(capacity), profile_tokens, profile_seqs)
                                : std::string("as configured");
  return fmt::format(
             "memory plan ({}): weights {:.2f} GiB, activations and workspaces {:.2f} GiB, other in use {:.2f} GiB, "
             "reserve {:.2f} GiB, KV cache {:.2f} GiB = {} tokens in the {} full-attention layers{} + {:.1f} MiB per "
             "sequence in the window layers{}; max_model_len {}, max concurrency {:.1f} sequences at that length",
             source, gib(weights), gib(workspaces), gib(other_in_use), gib(reserve), gib(kv_bytes), kv_tokens,
             num_full_layers, full_kv_dtype.empty() ? "" : " (" + full_kv_dtype + ")",
             double(window_bytes_per_sequence) / 1048576.0, window_kv_dtype.empty() ? "" : " (" + window_kv_dtype + ")",
             max_model_len, max_concurrency) +
         (draft_kv_bytes > 0 ? fmt::format("; drafter KV cache {:.2f} GiB", gib(draft_kv_bytes)) : std::string());
}

std::string describe_memory_plan(const KvMemoryPlan& p, const GptOssConfig& c) {
  const int heads = p.kv_heads > 0 ? p.kv_heads : c.num_key_value_heads;
  std::string out = fmt::format(
      "kv cache: full layers {} B per token (2 x {} layers x {} kv heads x {} dims x {} B)\n"
      "kv cache: window layers {} B per sequence (2 x {} layers x {} positions x {} kv heads x {} dims x {} B)\n"
      "kv cache: {} full blocks ({} tokens), {} window blocks, {} tokens per block, {} bytes in all\n",
      p.full_bytes_per_token, c.num_full_layers(), heads, c.head_dim, p.full_elem_bytes, p.window_bytes_per_sequence,
      c.num_sliding_layers(), c.sliding_window, heads, c.head_dim, p.window_elem_bytes, p.num_full_blocks,
      p.full_token_capacity(), p.num_window_blocks, p.block_size, p.total_bytes);
  if (heads != c.num_key_value_heads)
    out += fmt::format(
        "kv cache: figures are per tensor-parallel rank: each caches {} of the model's {} kv heads, "
        "and every rank holds the same blocks\n",
        heads, c.num_key_value_heads);
  return out;
}

}  // namespace ossrt
