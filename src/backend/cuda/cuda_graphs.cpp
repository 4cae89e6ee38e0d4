#include "backend/cuda/cuda_graphs.h"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/plan_upload.h"

namespace ossrt::cuda {

StepGraphCache::~StepGraphCache() {
  for (auto& [key, e] : graphs_) cudaGraphExecDestroy(e.exec);
}

void StepGraphCache::clear() {
  for (auto& [key, e] : graphs_) cudaGraphExecDestroy(e.exec);
  graphs_.clear();
}

std::vector<GraphUse> StepGraphCache::uses() const {
  std::vector<GraphUse> out;
  for (const auto& [key, e] : graphs_) out.push_back({key, e.replays});
  return out;
}

GraphKey StepGraphCache::key(const StepPlan& plan) const {
  if (!backend_.kv_) return {};
  GraphKey k = graph_key(plan);
  if (k.batch_bucket == 0) return {};
  // The model `step` runs was planned with the numbers the server gives the backend (max_seqs
  // sequences, max_step_tokens tokens, max_logit_rows logit rows) and would refuse a padded plan
  // beyond any of them: such plans run eagerly.
  const BackendOptions& o = backend_.options_;
  const int logit_rows = o.max_logit_rows > 0 ? o.max_logit_rows : o.max_seqs;
  if (k.batch_bucket > o.max_seqs || k.rows() > o.max_step_tokens || k.rows() > logit_rows) return {};
  // Of all launches only the decode attention's grid depends on the context (its split count,
  // CudaBackend::attention); it runs where every sequence has one token. With more, the prefill
  // attention tiles each sequence's T tokens and reads its context length from the device plan, so
  // one verify graph serves every context.
  if (k.seq_tokens > 1) k.context_bucket = 0;
  // Greedy-only plans launch other kernels only where the unembedding takes the greedy screen (one row).
  k.greedy_ids_only = k.greedy_ids_only && k.rows() == 1 && !backend_.greedy_screens_.empty();
  return k;
}

Tensor StepGraphCache::run(const StepPlan& plan, const GraphKey& key, const Backend::StepFn& step) {
  const int rows = plan.num_tokens();  // the real sequences' rows, all of them logit rows
  const auto& kv = *backend_.kv_;
  const StepPlan padded = pad_plan_to_bucket(plan, key.batch_bucket, kv.full.scratch_block, kv.window.scratch_block);
  OSSRT_CHECK(padded.num_tokens() == key.rows() && int(padded.logit_rows.size()) == key.rows(),
              "CUDA graphs: a plan of {} rows padded to {}, the key has {}", rows, padded.num_tokens(), key.rows());
  // A decode graph sees its context bucket as max_context, an upper bound of every context it
  // replays with, so the split count baked into it holds (CudaBackend::attention).
  StepPlanUploader& uploader = *backend_.plan_;
  if (key.context_bucket > 0) uploader.set_max_context_override(key.context_bucket);
  struct ResetOverride {
    StepPlanUploader& u;
    ~ResetOverride() { u.set_max_context_override(std::nullopt); }
  } reset{uploader};

  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    backend_.begin_step(padded);  // uploads into the buffers the graph reads
    OSSRT_CUDA_CHECK(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(it->second.exec), backend_.stream_));
    const Entry& e = it->second;
    backend_.fused_greedy_ = {e.greedy_logits, e.greedy_rows, e.greedy_vocab, true, e.greedy_logits_written};
    if (!e.greedy_logits_written) ++backend_.greedy_screen_steps_;
    ++it->second.replays;
    ++backend_.graph_replays_;
    return it->second.logits.rows(0, rows);
  }

  // First plan of this key: run it for real, then record the same sequence of launches.
  Tensor eager = step(padded);
  cudaStream_t stream = backend_.stream_;
  cudaGraph_t graph = nullptr;
  capturing_ = true;
  OSSRT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  Tensor captured;
  try {
    captured = step(padded);
  } catch (...) {
    capturing_ = false;
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  capturing_ = false;
  OSSRT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  OSSRT_CHECK(captured.data == eager.data && captured.dim(0) == eager.dim(0),
              "CUDA graph capture: the step returned a different logits buffer");
  cudaGraphExec_t exec = nullptr;
  OSSRT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  OSSRT_CUDA_CHECK(cudaGraphDestroy(graph));
  // The capture's unembed set the fused greedy state of the launches the graph holds (the eager run's
  // ids are in the buffer now: the capture launched nothing).
  const auto& greedy = backend_.fused_greedy_;
  graphs_[key] = Entry{reinterpret_cast<CUgraphExec_st*>(exec),
                       eager,
                       0,
                       greedy.logits,
                       greedy.rows,
                       greedy.vocab,
                       greedy.logits_written};
  spdlog::debug("cuda: captured a step graph for batch bucket {}, {} tokens a sequence, context bucket {}",
                key.batch_bucket, key.seq_tokens, key.context_bucket);
  return eager.rows(0, rows);
}

}  // namespace ossrt::cuda
