#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace ossrt {

Scheduler::Scheduler(const SchedulerConfig& config, KvCache& kv) : config_(config), kv_(kv) {
  OSSRT_CHECK(config.max_num_seqs > 0, "scheduler: max_num_seqs must be positive, got {}", config.max_num_seqs);
  OSSRT_CHECK(config.max_num_batched_tokens > 0, "scheduler: max_num_batched_tokens must be positive, got {}",
              config.max_num_batched_tokens);
}

void Scheduler::add_waiting(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

void Scheduler::preempt_newest() {
  std::unique_ptr<Sequence> victim = std::move(running_.back());
  running_.pop_back();
  kv_.free_sequence(victim->id);
  victim->drop_draft();  // it recomputes what it had; guesses are not part of it
  victim->num_computed = 0;
  ++victim->num_preemptions;
  ++stats_.preemptions;
  // Front of the queue: it was admitted before everything still waiting (FCFS).
  waiting_.push_front(std::move(victim));
}

bool Scheduler::admit(Sequence& seq, int budget, int& num_tokens) {
  kv_.add_sequence(seq.id);
  const int cached = kv_.claim_cached_prefix(seq.id, seq.tokens);
  seq.num_computed = cached;
  num_tokens = std::min(seq.num_pending(), budget);
  if (!kv_.allocate(seq.id, seq.num_computed, num_tokens)) {
    kv_.free_sequence(seq.id);
    seq.num_computed = 0;
    return false;
  }
  stats_.prefix_cache_queries += uint64_t(seq.tokens.size());
  stats_.prefix_cache_hits += uint64_t(cached);
  if (seq.cached_prompt_tokens < 0) seq.cached_prompt_tokens = std::min(cached, seq.prompt_len);
  if (seq.first_scheduled == Clock::time_point{}) seq.first_scheduled = Clock::now();
  return true;
}

std::vector<ScheduledSequence> Scheduler::schedule() {
  std::vector<ScheduledSequence> out;
  int budget = config_.max_num_batched_tokens;
  bool preempted = false;

  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& seq = *running_[i];
    // A drafted sequence is verified whole: guesses that do not fit the budget are dropped.
    if (seq.num_draft > 0 && seq.num_pending() > budget) {
      const int cut = std::min(seq.num_draft, seq.num_pending() - budget);
      seq.tokens.resize(seq.tokens.size() - size_t(cut));
      seq.num_draft -= cut;
    }
    int n = std::min(seq.num_pending(), budget);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool ok = kv_.allocate(seq.id, seq.num_computed, n);
    if (!ok && seq.num_draft > 0) {  // guesses never cost another sequence its place
      seq.drop_draft();
      n = std::min(seq.num_pending(), budget);
      ok = kv_.allocate(seq.id, seq.num_computed, n);
    }
    while (!ok && i < running_.size()) {
      preempt_newest();  // possibly `seq` itself when it is the newest
      preempted = true;
      if (i < running_.size()) ok = kv_.allocate(seq.id, seq.num_computed, n);
    }
    if (!ok) break;
    out.push_back({&seq, n, seq.num_computed + n == int(seq.tokens.size())});
    budget -= n;
    ++i;
  }

  // After a preemption the pools are tight: admitting new work would only preempt it again.
  while (!preempted && !waiting_.empty() && int(running_.size()) < config_.max_num_seqs && budget > 0) {
    Sequence& seq = *waiting_.front();
    int n = 0;
    if (!admit(seq, budget, n)) break;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    out.push_back({&seq, n, seq.num_computed + n == int(seq.tokens.size())});
    budget -= n;
  }
  return out;
}

std::unique_ptr<Sequence> Scheduler::remove(SequenceId id) {
  std::unique_ptr<Sequence> found;
  auto match = [id](const std::unique_ptr<Sequence>& s) { return s->id == id; };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    found = std::move(*it);
    running_.erase(it);
  } else if (auto wt = std::find_if(waiting_.begin(), waiting_.end(), match); wt != waiting_.end()) {
    found = std::move(*wt);
    waiting_.erase(wt);
  }
  kv_.free_sequence(id);
  return found;
}

Sequence* Scheduler::find_by_request_id(const std::string& request_id) {
  for (auto& s : running_)
    if (s->request.id == request_id) return s.get();
  for (auto& s : waiting_)
    if (s->request.id == request_id) return s.get();
  return nullptr;
}

}  // namespace ossrt
