#include "model/moe_block.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/gpt_oss.h"

namespace ossrt {

ReplicatedMoe::ReplicatedMoe(Backend& backend, const GptOssConfig& c, const ModelShard& s, int64_t max_step_tokens)
    : backend_(backend),
      k_(c.experts_per_token),
      dp_size_(s.dp_size),
      dp_rank_(s.dp_rank),
      dp_(s.dp),
      moe_(s.expert_size > 1 || s.expert_tp_size > 1 ? s.moe : nullptr),
      reduce_scatter_(s.dp_size > 1 && s.tp_size == 1) {
  OSSRT_CHECK(dp_size_ == 1 || (dp_ && moe_), "MoE with {} data-parallel groups needs the DP and MoE communicators",
              dp_size_);
  const int64_t T = max_step_tokens, H = c.hidden_size, k = k_, dp = dp_size_;
  const DType act = backend.activation_dtype();
  ids_ = backend.alloc(DType::I32, {T, k});
  weights_ = backend.alloc(DType::F32, {T, k});
  out_ = backend.alloc(act, {T, H});
  if (dp > 1) {
    group_tokens_ = backend.alloc(DType::F32, {dp});
    in_all_ = backend.alloc(act, {dp * T, H});
    out_all_ = backend.alloc(act, {dp * T, H});
    ids_all_ = backend.alloc(DType::I32, {dp * T, k});
    weights_all_ = backend.alloc(DType::F32, {dp * T, k});
  }
}

void ReplicatedMoe::begin_step(int64_t tokens) {
  tokens_ = tokens;
  group_rows_ = tokens;
  if (dp_size_ == 1) return;
  // Every DP group's rows are padded to the largest group's count, so the gathered rows of group d
  // start at d * group_rows_ on every rank.
  Tensor counts = group_tokens_, mine = counts.rows(dp_rank_, 1);
  const float t = float(tokens);
  backend_.from_host(mine, &t);
  dp_->all_gather(mine, counts);
  const std::vector<float> all = backend_.to_host_f32(counts);
  group_rows_ = int64_t(*std::max_element(all.begin(), all.end()));
}

Tensor ReplicatedMoe::run(const MoeInput& input, const Tensor& router_w, const Tensor& router_b,
                          const ExpertWeights& experts, const SwigluParams& swiglu, const Observe& observe) {
  const int64_t T = tokens_;
  const Tensor& normed = input.normed;
  OSSRT_CHECK(normed.dim(0) == T, "MoE: {} rows, the step began with {}", normed.dim(0), T);
  if (dp_size_ == 1) {
    Tensor ids = ids_.rows(0, T), weights = weights_.rows(0, T), out = out_.rows(0, T);
    // This rank routes exactly the rows it normalizes: one op, which a backend may fold.
    backend_.add_rmsnorm_router_topk(input.residual, input.delta, input.norm_w, input.eps, input.normed, router_w,
                                     router_b, k_, ids, weights);
    observe("router_ids", ids);
    observe("router_weights", weights);
    backend_.moe(normed, experts, ids, weights, swiglu, out);
    all_reduce_sum(moe_, out);  // the ranks' partial combines (their experts, their slices)
    return out;
  }
  // Data parallelism: the MoE runs on every DP group's rows. `normed` is the first T rows of the
  // model's [max_step_tokens, H] workspace, so its first group_rows_ rows exist; the rows past T are
  // padding, computed and dropped.
  backend_.add_rmsnorm(input.residual, input.delta, input.norm_w, input.eps, input.normed);
  const int64_t rows = dp_size_ * group_rows_;
  Tensor in = in_all_.rows(0, rows), out = out_all_.rows(0, rows);
  Tensor ids = ids_all_.rows(0, rows), weights = weights_all_.rows(0, rows);
  dp_->all_gather(normed.rows(0, group_rows_), in);
  backend_.router_topk(in, router_w, router_b, k_, ids, weights);
  observe("router_ids", ids);
  observe("router_weights", weights);
  backend_.moe(in, experts, ids, weights, swiglu, out);
  if (reduce_scatter_) {
    // The MoE ranks are exactly the DP ranks, in order: each keeps the sum of its own rows.
    Tensor own = out_.rows(0, group_rows_);
    moe_->reduce_scatter_sum(out, own);
    return out_.rows(0, T);
  }
  moe_->all_reduce_sum(out);
  return out.rows(dp_rank_ * group_rows_, T);
}

}  // namespace ossrt
