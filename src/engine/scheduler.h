#pragma once
// The phase-free scheduler (ARCHITECTURE.md): each step hands out a token budget. Running
// sequences go first, oldest first, each taking min(pending, budget) tokens (a decode takes 1, a
// prefill a chunk); then waiting sequences are admitted FCFS while the budget, max_num_seqs and the
// KV pools allow. Chunked prefill and decode share the step with no special case.
//
// When a running sequence cannot get KV blocks, the NEWEST running sequence is preempted by
// recompute: its blocks are freed, it goes back to the front of the waiting queue and later
// recomputes its prompt plus the tokens it had generated (often straight from the prefix cache).
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "engine/sequence.h"
#include "kvcache/kv_cache.h"

namespace ossrt {

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
};

struct ScheduledSequence {
  Sequence* seq = nullptr;
  int num_tokens = 0;    // tokens computed this step, starting at seq->num_computed
  bool samples = false;  // the step reaches the end of its tokens, so it samples the next one
};

struct SchedulerStats {
  uint64_t preemptions = 0;
  uint64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in tokens
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCache& kv);

  void add_waiting(std::unique_ptr<Sequence> seq);
  // Picks this step's sequences and token counts and reserves their KV blocks.
  std::vector<ScheduledSequence> schedule();
  // Removes a sequence (finished or cancelled) from whichever list holds it and frees its blocks.
  std::unique_ptr<Sequence> remove(SequenceId id);
  Sequence* find_by_request_id(const std::string& request_id);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int num_running() const { return int(running_.size()); }
  int num_waiting() const { return int(waiting_.size()); }
  const SchedulerStats& stats() const { return stats_; }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  const std::deque<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }

 private:
  void preempt_newest();
  bool admit(Sequence& seq, int budget, int& num_tokens);

  SchedulerConfig config_;
  KvCache& kv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order: newest at the back
  SchedulerStats stats_;
};

}  // namespace ossrt
