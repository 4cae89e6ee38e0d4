#include "engine/eagle3_drafter.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace ossrt {

Eagle3Drafter::Eagle3Drafter(GptOssModel& target, Eagle3Head& head, int num_speculative_tokens, int max_model_len,
                             int max_seqs, int block_size, int num_blocks)
    : target_(target),
      head_(head),
      k_(num_speculative_tokens),
      capacity_(max_model_len),
      block_size_(block_size),
      max_seqs_(max_seqs) {
  OSSRT_CHECK(k_ >= 1 && max_model_len > 0 && max_seqs > 0 && block_size > 0 && num_blocks >= 0,
              "eagle3 drafter: k {}, max_model_len {}, max_seqs {}, block_size {}, {} blocks", k_, max_model_len,
              max_seqs, block_size, num_blocks);
  const Eagle3Config& hc = head.config();
  OSSRT_CHECK(hc.target_hidden_size == target.config().hidden_size && hc.vocab_size == target.config().vocab_size,
              "eagle3 drafter: the head reads states of width {} over {} tokens, the target has {} and {}",
              hc.target_hidden_size, hc.vocab_size, target.config().hidden_size, target.config().vocab_size);
  // Logit rows: one per sequence drafted for in a step, which holds at most max_seqs sequences and no
  // more sequences than tokens.
  const int64_t logit_rows = std::min<int64_t>(max_seqs, target.limits().max_step_tokens);
  OSSRT_CHECK(head.max_step_tokens() >= target.limits().max_step_tokens && head.max_logit_rows() >= logit_rows,
              "eagle3 drafter: the head was planned for {} rows and {} logit rows; the target's steps need {} and {}",
              head.max_step_tokens(), head.max_logit_rows(), target.limits().max_step_tokens, logit_rows);
  target.set_capture_layers(hc.aux_layers);
  reset_pool(num_blocks > 0 ? num_blocks : max_seqs * ((max_model_len + block_size - 1) / block_size));
  for (int s = max_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
}

void Eagle3Drafter::reset_pool(int num_blocks) {
  OSSRT_CHECK(followed() == 0, "eagle3 drafter: the head's cache replaced while {} sequences hold blocks", followed());
  head_.allocate_kv_cache(num_blocks, block_size_);
  num_blocks_ = num_blocks;
  free_blocks_.clear();
  for (int b = num_blocks - 1; b >= 0; --b) free_blocks_.push_back(b);
}

DrafterKvMemory Eagle3Drafter::kv_memory() const {
  Backend& b = head_.backend();
  if (b.device() == Device::CPU) return {};
  KvCacheShape shape;
  shape.num_full_layers = 1;
  shape.block_size = block_size_;
  shape.num_kv_heads = head_.config().num_key_value_heads;
  shape.head_dim = head_.config().head_dim;
  const size_t block = b.kv_full_block_bytes(shape);
  // The chain rows of every followed sequence, and one block a backend may keep for itself (CUDA's
  // scratch block for padded graph rows).
  return DrafterKvMemory{block / size_t(block_size_), block * (size_t(max_seqs_) * size_t(chain_blocks()) + 1)};
}

void Eagle3Drafter::allocate_kv(int64_t target_tokens) {
  if (kv_memory().bytes_per_target_token == 0) return;
  const int64_t blocks = (target_tokens + block_size_ - 1) / block_size_ + int64_t(max_seqs_) * chain_blocks();
  OSSRT_CHECK(blocks > 0 && blocks <= std::numeric_limits<int32_t>::max(), "eagle3 drafter: a pool of {} blocks",
              blocks);
  reset_pool(int(blocks));
}

bool Eagle3Drafter::reserve_blocks(SeqState& s, int positions) {
  const size_t need = size_t((positions + block_size_ - 1) / block_size_);
  if (need <= s.blocks.size()) return true;
  if (need - s.blocks.size() > free_blocks_.size()) return false;
  while (s.blocks.size() < need) {
    s.blocks.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  return true;
}

int Eagle3Drafter::followed() const {
  return int(std::count_if(seqs_.begin(), seqs_.end(), [](const auto& kv) { return kv.second.slot >= 0; }));
}

void Eagle3Drafter::release(SeqState& s) {
  if (s.slot >= 0) free_slots_.push_back(s.slot);
  free_blocks_.insert(free_blocks_.end(), s.blocks.rbegin(), s.blocks.rend());
  s.blocks.clear();
  s.slot = -1;
  s.head_len = 0;
  s.draft.clear();
}

Draft Eagle3Drafter::propose(const DraftRequest& request) {
  auto it = seqs_.find(request.sequence);
  if (it == seqs_.end() || request.max_tokens <= 0) return {};
  const SeqState& s = it->second;
  if (s.draft.empty() || s.draft_for != request.tokens.size()) return {};
  const size_t n = std::min(s.draft.size(), size_t(request.max_tokens));
  return Draft{std::vector<int32_t>(s.draft.begin(), s.draft.begin() + ptrdiff_t(n)), {}};
}

void Eagle3Drafter::finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) {
  (void)tokens, (void)prompt_len;
  auto it = seqs_.find(sequence);
  if (it == seqs_.end()) return;
  release(it->second);
  seqs_.erase(it);
}

void Eagle3Drafter::observe_step(std::span<const StepRows> rows) {
  struct Item {
    SeqState* state;
    const StepRows* rows;
    int count;          // real rows the head runs: positions [first_position, first_position + count)
    bool wants_draft;   // its last row is the newest real token's predecessor: it decodes next
    int32_t last = -1;  // the chain's newest guess
  };
  std::vector<Item> items;
  for (const StepRows& r : rows) {
    SeqState& s = seqs_[r.sequence];
    s.draft.clear();
    if (r.first_position == 0) {  // a new sequence, or one recomputed after preemption
      if (s.slot < 0 && !free_slots_.empty()) {
        s.slot = free_slots_.back();
        free_slots_.pop_back();
      } else if (s.slot < 0) {
        ++unfollowed_;
      }
      s.head_len = 0;
    }
    if (s.slot < 0) continue;
    if (r.first_position != s.head_len) {  // rows the head never saw: it cannot follow this sequence
      release(s);
      continue;
    }
    // Row p pairs the state at p with token p + 1, which exists for every accepted row of a sequence
    // that lives on (the sampled token follows the last one).
    const int with_next = int(r.tokens.size()) - 1 - r.first_position;
    const int count = std::min({r.valid, with_next, capacity_ - r.first_position});
    if (count <= 0) continue;
    const bool wants_draft = r.first_position + count == int(r.tokens.size()) - 1;
    // Blocks for the real rows and, when it drafts, the chain rows after them (inside max_model_len).
    const int positions = std::min(r.first_position + count + (wants_draft ? k_ - 1 : 0), capacity_);
    if (!reserve_blocks(s, positions)) {  // the pool is spent: this sequence decodes plainly from now on
      release(s);
      ++unfollowed_;
      continue;
    }
    items.push_back(Item{&s, &r, count, wants_draft});
  }
  if (items.empty()) return;

  // The captured target states of the step's rows, concatenated per row in the head's layer order.
  const size_t n_aux = target_.capture_layers().size();
  const size_t Ht = size_t(target_.config().hidden_size);
  captured_.resize(n_aux);
  for (size_t i = 0; i < n_aux; ++i) captured_[i] = target_.backend().to_host_f32(target_.captured(i));
  const size_t target_rows = captured_.empty() ? 0 : captured_[0].size() / Ht;

  StepPlan plan;
  plan.block_size = block_size_;
  states_.clear();
  for (const Item& item : items) {
    const StepRows& r = *item.rows;
    const SeqState& state = *item.state;
    SeqStep s;
    s.token_begin = plan.num_tokens();
    s.num_tokens = item.count;
    s.context_begin = r.first_position;
    s.full_table_begin = int(plan.full_block_table.size());
    s.full_table_len = (r.first_position + item.count + block_size_ - 1) / block_size_;
    for (int b = 0; b < s.full_table_len; ++b) plan.full_block_table.push_back(state.blocks[size_t(b)]);
    const int seq_index = plan.num_seqs();
    for (int i = 0; i < item.count; ++i) {
      const int pos = r.first_position + i;
      const size_t row = size_t(r.first_row + i);
      OSSRT_CHECK(row < target_rows, "eagle3 drafter: step row {} beyond the {} captured rows", row, target_rows);
      plan.token_ids.push_back(r.tokens[size_t(pos + 1)]);
      plan.positions.push_back(pos);
      plan.token_seq.push_back(seq_index);
      plan.full_slots.push_back(slot_of(state, pos));
      plan.window_slots.push_back(0);  // the head has no window layer
      for (size_t a = 0; a < n_aux; ++a)
        states_.insert(states_.end(), captured_[a].begin() + ptrdiff_t(row * Ht),
                       captured_[a].begin() + ptrdiff_t((row + 1) * Ht));
    }
    if (item.wants_draft) plan.logit_rows.push_back(s.token_begin + item.count - 1);
    plan.seqs.push_back(s);
    item.state->head_len = r.first_position + item.count;
  }
  const std::vector<int32_t> first = head_.step_from_target(plan, states_);
  head_rows_ += plan.num_tokens();

  // The chains: guess 1 from the real rows, then one chain row per sequence and step.
  std::vector<Item*> chain;
  for (Item& item : items)
    if (item.wants_draft) chain.push_back(&item);
  if (chain.empty()) return;
  int steps = k_ - 1;  // chain rows sit at positions head_len .. head_len + steps - 1, inside the slot
  for (size_t i = 0; i < chain.size(); ++i) {
    Item& item = *chain[i];
    item.last = first[i];
    item.state->draft.assign(1, first[i]);
    item.state->draft_for = item.rows->tokens.size();
    steps = std::min(steps, capacity_ - item.state->head_len);
  }
  for (int j = 0; j < steps; ++j) {
    StepPlan cp;
    cp.block_size = block_size_;
    for (Item* item : chain) {
      const SeqState& state = *item->state;
      const int pos = state.head_len + j;
      SeqStep s;
      s.token_begin = cp.num_tokens();
      s.num_tokens = 1;
      s.context_begin = pos;
      s.full_table_begin = int(cp.full_block_table.size());
      s.full_table_len = (pos + 1 + block_size_ - 1) / block_size_;
      for (int b = 0; b < s.full_table_len; ++b) cp.full_block_table.push_back(state.blocks[size_t(b)]);
      cp.token_ids.push_back(item->last);
      cp.positions.push_back(pos);
      cp.token_seq.push_back(cp.num_seqs());
      cp.full_slots.push_back(slot_of(state, pos));
      cp.window_slots.push_back(0);
      cp.logit_rows.push_back(s.token_begin);
      cp.seqs.push_back(s);
    }
    const std::vector<int32_t> next = head_.step_from_previous(cp);
    head_rows_ += cp.num_tokens();
    for (size_t i = 0; i < chain.size(); ++i) {
      chain[i]->last = next[i];
      chain[i]->state->draft.push_back(next[i]);
    }
  }
}

}  // namespace ossrt
