#pragma once
// CUDA graphs for decode steps. A decode-only plan of B sequences is padded to the next batch
// bucket (1, 2, 4, ..., 512: vLLM's largest --max-num-seqs default) with dummy sequences that read and write only the
// KV pools' scratch block, and to a context bucket (a power of two) that fixes the attention split count baked into the
// graph. The first plan of a (batch, context) bucket runs eagerly and is then captured; later plans upload their arrays
// into the same fixed device buffers and replay the graph.
#include <map>
#include <utility>

#include "backend/backend.h"

struct CUgraphExec_st;

namespace ossrt {
class CudaBackend;
}

namespace ossrt::cuda {

inline constexpr int kDecodeBatchBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
inline constexpr int kMinContextBucket = 1024;

// Smallest bucket >= n, or 0 when n is larger than every bucket.
int decode_batch_bucket(int n);
// Smallest power of two >= max(n, kMinContextBucket).
int decode_context_bucket(int n);
// The plan padded to `bucket` sequences; padded rows use block `full_scratch` / `window_scratch`.
StepPlan pad_decode_plan(const StepPlan& plan, int bucket, int full_scratch, int window_scratch);

class DecodeGraphCache {
 public:
  explicit DecodeGraphCache(CudaBackend& backend) : backend_(backend) {}
  ~DecodeGraphCache();
  DecodeGraphCache(const DecodeGraphCache&) = delete;
  DecodeGraphCache& operator=(const DecodeGraphCache&) = delete;

  // True when `plan` can run as a graph: decode-only, at most 512 sequences in row order, one
  // logit row per sequence in order, KV cache allocated.
  bool graphable(const StepPlan& plan) const;
  Tensor run(const StepPlan& plan, const Backend::StepFn& step);
  bool capturing() const { return capturing_; }
  int size() const { return int(graphs_.size()); }
  // Destroys every captured graph (they hold the addresses of the KV storage being replaced).
  void clear();

 private:
  struct Entry {
    CUgraphExec_st* exec = nullptr;
    Tensor logits;
  };
  CudaBackend& backend_;
  std::map<std::pair<int, int>, Entry> graphs_;
  bool capturing_ = false;
};

}  // namespace ossrt::cuda
