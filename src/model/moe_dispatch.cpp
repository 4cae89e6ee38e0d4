// All-to-all expert dispatch (see moe_dispatch.h for the six steps). The routing is planned on the
// host from the router's ids: which rank gets which pair, where it sits in the exchange buffers and
// where its result comes home. The device work is Backend ops (router_topk, gather_rows, moe,
// sum_rows) and the communicator's collectives.
#include "model/moe_dispatch.h"

#include <algorithm>

#include "core/error.h"
#include "model/gpt_oss.h"

namespace ossrt {

MoeDispatcher::MoeDispatcher(Backend& backend, const GptOssConfig& c, const ModelShard& s, int64_t max_step_tokens)
    : backend_(backend) {
  OSSRT_CHECK(backend.supports_moe_dispatch(),
              "--expert-dispatch all_to_all: backend '{}' has no all-to-all expert dispatch (use replicate)",
              backend.name());
  OSSRT_CHECK(
      s.expert_size > 1 && s.moe,
      "--expert-dispatch all_to_all needs expert parallelism (--expert-parallel-size > 1) and its communicator");
  world_ = s.moe;
  // The ranks holding the same rows: with data parallelism the DP group's tensor-parallel ranks
  // (none besides this one when tp = 1); otherwise every rank (tp groups and attention replicas).
  rows_ = s.dp_size > 1 ? s.tp : s.moe;
  world_size_ = world_->size(), rank_ = world_->rank();
  row_group_size_ = rows_ ? rows_->size() : 1, row_group_rank_ = rows_ ? rows_->rank() : 0;
  OSSRT_CHECK(world_size_ == s.expert_size * s.expert_tp_size && rank_ / s.expert_tp_size == s.expert_rank,
              "all-to-all dispatch: rank {} of {} does not sit in expert group {} of {} x {} slices", rank_,
              world_size_, s.expert_rank, s.expert_size, s.expert_tp_size);
  OSSRT_CHECK(s.dp_size == 1 || row_group_size_ * s.dp_size == world_size_,
              "all-to-all dispatch: {} DP groups of {} ranks do not make the world of {}", s.dp_size, row_group_size_,
              world_size_);
  k_ = c.experts_per_token;
  hidden_ = c.hidden_size;
  experts_per_group_ = c.num_experts / s.expert_size;
  expert_tp_ = s.expert_tp_size;
  local_experts_ = experts_per_group_;
  first_local_expert_ = s.expert_rank * experts_per_group_;

  // A rank routes at most c rows; it sends each pair once to each rank of the expert's group, so at
  // most c k pairs to any one rank: the padded chunk never exceeds c k rows.
  const int64_t n = row_group_size_, slice = (max_step_tokens + n - 1) / n, world = world_size_;
  const int64_t exchange_rows = world * slice * k_, H = hidden_;
  const DType act = backend.activation_dtype();
  ids_ = backend.alloc(DType::I32, {slice, k_});
  weights_ = backend.alloc(DType::F32, {slice, k_});
  counts_ = backend.alloc(DType::F32, {world});
  count_matrix_ = backend.alloc(DType::F32, {world * world});
  send_ = backend.alloc(act, {exchange_rows, H});
  recv_ = backend.alloc(act, {exchange_rows, H});
  meta_send_ = backend.alloc(DType::F32, {exchange_rows, 2});
  meta_recv_ = backend.alloc(DType::F32, {exchange_rows, 2});
  recv_ids_ = backend.alloc(DType::I32, {exchange_rows, 1});
  recv_weights_ = backend.alloc(DType::F32, {exchange_rows, 1});
  result_send_ = backend.alloc(act, {exchange_rows, H});
  result_recv_ = backend.alloc(act, {exchange_rows, H});
  combined_ = backend.alloc(act, {slice, H});
  if (n > 1) gathered_ = backend.alloc(act, {n * slice, H});
}

MoeDispatcher::OwnRows MoeDispatcher::own_rows(int64_t tokens) const {
  // Contiguous slices of ceil(T / n) rows: the row group's all_gather of equal slices then lays the
  // rows out in order, the short or empty slices' padding falling past row T.
  OwnRows o;
  o.slice = (tokens + row_group_size_ - 1) / row_group_size_;
  o.begin = std::min(tokens, row_group_rank_ * o.slice);
  o.count = std::min(o.slice, tokens - o.begin);
  return o;
}

int64_t MoeDispatcher::plan_exchange(const Tensor& normed, const OwnRows& own, const Tensor& router_w,
                                     const Tensor& router_b) {
  const int64_t L = own.count, k = k_, world = world_size_;
  const int64_t total_experts = experts_per_group_ * (world_size_ / expert_tp_);
  host_ids_.resize(size_t(L * k));
  host_weights_.resize(size_t(L * k));
  if (L > 0) {
    Tensor ids = ids_.rows(0, L), weights = weights_.rows(0, L);
    backend_.router_topk(normed.rows(own.begin, L), router_w, router_b, k_, ids, weights);
    backend_.to_host(ids, host_ids_.data());
    backend_.to_host(weights, host_weights_.data());
  }
  // Pairs per destination rank: every rank of the expert's group gets the pair.
  std::vector<float> counts(size_t(world), 0.0f);
  for (int32_t e : host_ids_) {
    OSSRT_CHECK(e >= 0 && e < total_experts, "all-to-all dispatch: router chose expert {} of {}", e, total_experts);
    for (int64_t m = 0; m < expert_tp_; ++m) counts[size_t(e / experts_per_group_ * expert_tp_ + m)] += 1.0f;
  }
  backend_.from_host(counts_, counts.data());
  world_->all_gather(counts_, count_matrix_);
  matrix_host_.resize(size_t(world * world));
  backend_.to_host(count_matrix_, matrix_host_.data());
  matrix_.assign(matrix_host_.begin(), matrix_host_.end());
  const int64_t chunk = *std::max_element(matrix_.begin(), matrix_.end());

  // Chunk d of the send buffer goes to rank d; padding rows are zero (never computed on).
  send_rows_.assign(size_t(world * chunk), -1);
  meta_host_.assign(size_t(world * chunk * 2), 0.0f);
  combine_index_.resize(size_t(L * k * expert_tp_));
  std::vector<int64_t> filled(size_t(world), 0);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t slot = 0; slot < k; ++slot) {
      const int32_t e = host_ids_[size_t(t * k + slot)];
      for (int64_t m = 0; m < expert_tp_; ++m) {
        const int64_t dst = e / experts_per_group_ * expert_tp_ + m;
        const int64_t pos = dst * chunk + filled[size_t(dst)]++;
        send_rows_[size_t(pos)] = int32_t(own.begin + t);
        meta_host_[size_t(2 * pos)] = host_weights_[size_t(t * k + slot)];
        meta_host_[size_t(2 * pos + 1)] = float(e);  // exact: expert ids are far below 2^24
        // The result comes home at the same position of the second exchange's buffer.
        combine_index_[size_t((t * k + slot) * expert_tp_ + m)] = int32_t(pos);
      }
    }
  return chunk;
}

void MoeDispatcher::run_local_experts(int64_t chunk, const ExpertWeights& experts, const SwigluParams& swiglu) {
  const int64_t world = world_size_, rows = world * chunk;
  meta_host_.resize(size_t(rows * 2));
  backend_.to_host(meta_recv_.rows(0, rows), meta_host_.data());
  // Padding rows get a harmless local id and weight 0; they are never passed to moe().
  recv_ids_host_.assign(size_t(rows), int32_t(first_local_expert_));
  recv_weights_host_.assign(size_t(rows), 0.0f);
  for (int64_t src = 0; src < world; ++src)
    for (int64_t i = 0; i < matrix_[size_t(src * world + rank_)]; ++i) {
      const int64_t row = src * chunk + i;
      const float id = meta_host_[size_t(2 * row + 1)];
      OSSRT_CHECK(id >= float(first_local_expert_) && id < float(first_local_expert_ + local_experts_),
                  "all-to-all dispatch: rank {} sent expert {} to rank {}, which holds [{}, {})", src, id, rank_,
                  first_local_expert_, first_local_expert_ + local_experts_);
      recv_ids_host_[size_t(row)] = int32_t(id);
      recv_weights_host_[size_t(row)] = meta_host_[size_t(2 * row)];
    }
  Tensor ids = recv_ids_.rows(0, rows), weights = recv_weights_.rows(0, rows);
  backend_.from_host(ids, recv_ids_host_.data());
  backend_.from_host(weights, recv_weights_host_.data());
  // One slot per row: moe() gives 0 + w * expert(x), the weighted output the sender sums.
  for (int64_t src = 0; src < world; ++src) {
    const int64_t count = matrix_[size_t(src * world + rank_)];
    if (count == 0) continue;
    Tensor out = result_send_.rows(src * chunk, count);
    backend_.moe(recv_.rows(src * chunk, count), experts, ids.rows(src * chunk, count),
                 weights.rows(src * chunk, count), swiglu, out);
  }
}

Tensor MoeDispatcher::run(const MoeInput& input, const Tensor& router_w, const Tensor& router_b,
                          const ExpertWeights& experts, const SwigluParams& swiglu, const Observe& /*observe*/) {
  // Each rank routes only its own slice of the rows it normalizes: the norm stays its own op.
  backend_.add_rmsnorm(input.residual, input.delta, input.norm_w, input.eps, input.normed);
  const Tensor& normed = input.normed;
  const int64_t T = normed.dim(0);
  const OwnRows own = own_rows(T);
  OSSRT_CHECK(own.slice <= combined_.dim(0), "all-to-all dispatch: step of {} rows, planned for {} per rank", T,
              combined_.dim(0) * row_group_size_);
  const int64_t chunk = plan_exchange(normed, own, router_w, router_b);
  Tensor combined = combined_.rows(0, own.count);
  if (chunk > 0) {  // every rank sees the same count matrix, so all exchange or none does
    const int64_t rows = world_size_ * chunk;
    // Holds while every rank's step fits max_step_tokens (each rank's forward checks its own).
    OSSRT_CHECK(rows <= send_.dim(0), "all-to-all dispatch: {} exchange rows, planned for {}", rows, send_.dim(0));
    Tensor send = send_.rows(0, rows), recv = recv_.rows(0, rows);
    Tensor meta_send = meta_send_.rows(0, rows), meta_recv = meta_recv_.rows(0, rows);
    backend_.gather_rows(normed, send_rows_, send);
    backend_.from_host(meta_send, meta_host_.data());
    world_->all_to_all(send, recv);
    world_->all_to_all(meta_send, meta_recv);
    run_local_experts(chunk, experts, swiglu);
    Tensor results = result_recv_.rows(0, rows);
    world_->all_to_all(result_send_.rows(0, rows), results);
    backend_.sum_rows(results, combine_index_, int(k_ * expert_tp_), combined);
  }
  if (row_group_size_ == 1) return combined;
  if (own.slice == 0) return gathered_.rows(0, 0);  // the row group has no rows this step
  Tensor all = gathered_.rows(0, row_group_size_ * own.slice);
  rows_->all_gather(combined_.rows(0, own.slice), all);
  return all.rows(0, T);
}

}  // namespace ossrt
