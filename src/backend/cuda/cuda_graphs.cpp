#include "backend/cuda/cuda_graphs.h"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/plan_upload.h"

namespace ossrt::cuda {

int decode_batch_bucket(int n) {
  for (int b : kDecodeBatchBuckets)
    if (n <= b) return b;
  return 0;
}

int decode_context_bucket(int n) {
  int b = kMinContextBucket;
  while (b < n) b *= 2;
  return b;
}

StepPlan pad_decode_plan(const StepPlan& plan, int bucket, int full_scratch, int window_scratch) {
  StepPlan p = plan;
  const int bs = plan.block_size;
  for (int i = plan.num_seqs(); i < bucket; ++i) {
    p.token_ids.push_back(0);
    p.positions.push_back(0);
    p.token_seq.push_back(i);
    p.full_slots.push_back(full_scratch * bs);
    p.window_slots.push_back(window_scratch * bs);
    SeqStep s;
    s.token_begin = i;
    s.num_tokens = 1;
    s.context_begin = 0;
    s.full_table_begin = int32_t(p.full_block_table.size());
    s.full_table_len = 1;
    s.window_table_begin = int32_t(p.window_block_table.size());
    s.window_table_len = 1;
    s.window_first_block = 0;
    p.full_block_table.push_back(full_scratch);
    p.window_block_table.push_back(window_scratch);
    p.seqs.push_back(s);
  }
  p.logit_rows.resize(size_t(bucket));
  for (int i = 0; i < bucket; ++i) p.logit_rows[size_t(i)] = i;
  return p;
}

DecodeGraphCache::~DecodeGraphCache() {
  for (auto& [key, e] : graphs_) cudaGraphExecDestroy(e.exec);
}

void DecodeGraphCache::clear() {
  for (auto& [key, e] : graphs_) cudaGraphExecDestroy(e.exec);
  graphs_.clear();
}

bool DecodeGraphCache::graphable(const StepPlan& plan) const {
  const int n = plan.num_seqs();
  if (n == 0 || !plan.is_decode_only() || decode_batch_bucket(n) == 0 || !backend_.kv_) return false;
  if (plan.num_tokens() != n || int(plan.logit_rows.size()) != n) return false;
  for (int i = 0; i < n; ++i) {
    if (plan.seqs[size_t(i)].token_begin != i || plan.logit_rows[size_t(i)] != i) return false;
  }
  return true;
}

Tensor DecodeGraphCache::run(const StepPlan& plan, const Backend::StepFn& step) {
  const int n = plan.num_seqs();
  const int bucket = decode_batch_bucket(n);
  const int ctx = decode_context_bucket(plan.max_context());
  const auto& kv = *backend_.kv_;
  const StepPlan padded = pad_decode_plan(plan, bucket, kv.full.scratch_block, kv.window.scratch_block);
  StepPlanUploader& uploader = *backend_.plan_;
  uploader.set_max_context_override(ctx);
  struct ResetOverride {
    StepPlanUploader& u;
    ~ResetOverride() { u.set_max_context_override(std::nullopt); }
  } reset{uploader};

  const std::pair<int, int> key{bucket, ctx};
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    backend_.begin_step(padded);  // uploads into the buffers the graph reads
    OSSRT_CUDA_CHECK(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(it->second.exec), backend_.stream_));
    ++backend_.graph_replays_;
    return it->second.logits.rows(0, n);
  }

  // First plan of this bucket: run it for real, then record the same sequence of launches.
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
  OSSRT_CHECK(captured.data == eager.data, "CUDA graph capture: the step returned a different logits buffer");
  cudaGraphExec_t exec = nullptr;
  OSSRT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  OSSRT_CUDA_CHECK(cudaGraphDestroy(graph));
  graphs_[key] = Entry{reinterpret_cast<CUgraphExec_st*>(exec), eager};
  spdlog::debug("cuda: captured decode graph for batch bucket {} context bucket {}", bucket, ctx);
  return eager.rows(0, n);
}

}  // namespace ossrt::cuda
