#pragma once
// CUDA graphs for decode and verify steps: plans of B sequences with T tokens each, every row's logits
// (backend/graph_plan.h). A plan is padded to the next batch bucket (1, 2, 4, ..., 512) with dummy
// sequences of T tokens that read and write only the KV pools' scratch block, and keyed by (batch
// bucket, T, context bucket). The first plan of a key runs eagerly and is then captured; later plans
// upload their arrays into the same fixed device buffers and replay the graph.
#include <map>
#include <vector>

#include "backend/backend.h"
#include "backend/graph_plan.h"

struct CUgraphExec_st;

namespace ossrt {
class CudaBackend;
}

namespace ossrt::cuda {

// One captured graph and how often it was replayed (tests check that a kind of step used graphs).
struct GraphUse {
  GraphKey key;
  int replays = 0;
};

class StepGraphCache {
 public:
  explicit StepGraphCache(CudaBackend& backend) : backend_(backend) {}
  ~StepGraphCache();
  StepGraphCache(const StepGraphCache&) = delete;
  StepGraphCache& operator=(const StepGraphCache&) = delete;

  // The key `plan` runs under, or batch_bucket 0 when it runs eagerly: not uniform
  // (graph_plan.h), no KV cache yet, or a padded plan beyond what the backend and the model were
  // planned for (BackendOptions::max_seqs, max_step_tokens, max_logit_rows).
  GraphKey key(const StepPlan& plan) const;
  // Runs `plan` (with key(plan) == key) through the graph of `key`, capturing it first if needed.
  Tensor run(const StepPlan& plan, const GraphKey& key, const Backend::StepFn& step);
  bool capturing() const { return capturing_; }
  int size() const { return int(graphs_.size()); }
  std::vector<GraphUse> uses() const;
  // Destroys every captured graph (they hold the addresses of the KV storage being replaced).
  void clear();

 private:
  struct Entry {
    CUgraphExec_st* exec = nullptr;
    Tensor logits;
    int replays = 0;
    // What the captured step's unembed said of its fused greedy ids (CudaBackend::fused_greedy_),
    // restored at each replay after begin_step cleared it.
    const void* greedy_logits = nullptr;
    int64_t greedy_rows = 0, greedy_vocab = 0;
    bool greedy_logits_written = true;
  };
  CudaBackend& backend_;
  std::map<GraphKey, Entry> graphs_;
  bool capturing_ = false;
};

}  // namespace ossrt::cuda
