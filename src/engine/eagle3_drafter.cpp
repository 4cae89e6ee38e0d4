#include "engine/eagle3_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace ossrt {

Eagle3Drafter::Eagle3Drafter(GptOssModel& target, Eagle3Head& head, int num_speculative_tokens, int max_model_len,
                             int max_seqs, int block_size)
    : target_(target),
      head_(head),
      k_(num_speculative_tokens),
      capacity_(max_model_len),
      block_size_(block_size),
      blocks_per_slot_((max_model_len + block_size - 1) / block_size) {
  OSSRT_CHECK(k_ >= 1 && max_model_len > 0 && max_seqs > 0 && block_size > 0,
              "eagle3 drafter: k {}, max_model_len {}, max_seqs {}, block_size {}", k_, max_model_len, max_seqs,
              block_size);
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
  head.allocate_kv_cache(max_seqs * blocks_per_slot_, block_size);
  for (int s = max_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
}

int Eagle3Drafter::followed() const {
  return int(std::count_if(seqs_.begin(), seqs_.end(), [](const auto& kv) { return kv.second.slot >= 0; }));
}

void Eagle3Drafter::release(SeqState& s) {
  if (s.slot >= 0) free_slots_.push_back(s.slot);
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
    items.push_back(Item{&s, &r, count, r.first_position + count == int(r.tokens.size()) - 1});
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
    const int slot = item.state->slot;
    SeqStep s;
    s.token_begin = plan.num_tokens();
    s.num_tokens = item.count;
    s.context_begin = r.first_position;
    s.full_table_begin = int(plan.full_block_table.size());
    s.full_table_len = (r.first_position + item.count + block_size_ - 1) / block_size_;
    for (int b = 0; b < s.full_table_len; ++b) plan.full_block_table.push_back(slot * blocks_per_slot_ + b);
    const int seq_index = plan.num_seqs();
    for (int i = 0; i < item.count; ++i) {
      const int pos = r.first_position + i;
      const size_t row = size_t(r.first_row + i);
      OSSRT_CHECK(row < target_rows, "eagle3 drafter: step row {} beyond the {} captured rows", row, target_rows);
      plan.token_ids.push_back(r.tokens[size_t(pos + 1)]);
      plan.positions.push_back(pos);
      plan.token_seq.push_back(seq_index);
      plan.full_slots.push_back(slot_block(slot, pos) * block_size_ + pos % block_size_);
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
      const int slot = item->state->slot, pos = item->state->head_len + j;
      SeqStep s;
      s.token_begin = cp.num_tokens();
      s.num_tokens = 1;
      s.context_begin = pos;
      s.full_table_begin = int(cp.full_block_table.size());
      s.full_table_len = (pos + 1 + block_size_ - 1) / block_size_;
      for (int b = 0; b < s.full_table_len; ++b) cp.full_block_table.push_back(slot * blocks_per_slot_ + b);
      cp.token_ids.push_back(item->last);
      cp.positions.push_back(pos);
      cp.token_seq.push_back(cp.num_seqs());
      cp.full_slots.push_back(slot_block(slot, pos) * block_size_ + pos % block_size_);
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
