#pragma once
// The MoE half of a layer as one rank computes it: route the tokens, run the experts this rank holds,
// and combine, with the communication a sharded MoE needs at the points where it happens. The forward
// (model/gpt_oss.cpp) calls one MoeBlock per model and does not know how the experts are spread:
//   ReplicatedMoe (below): every rank routes every token of its attention group and runs its local
//     experts on them; the partial combines are summed across the MoE ranks. Unsharded, it is the
//     plain router_topk + moe with nothing to exchange.
//   MoeDispatcher (model/moe_dispatch.h): each rank routes its own rows and sends each (token, expert)
//     pair to the expert's owner (--expert-dispatch all_to_all).
#include <cstdint>
#include <functional>
#include <string>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "config/gpt_oss_config.h"

namespace ossrt {

struct ModelShard;

// The MoE's input as the layer hands it over: normed = rmsnorm(residual + delta) * norm_w, with
// residual += delta in place. The block runs that norm itself, so that where it routes every row it
// holds it may fold the norm into the router (Backend::add_rmsnorm_router_topk).
struct MoeInput {
  Tensor& residual;
  const Tensor& delta;
  const Tensor& norm_w;
  float eps;
  Tensor& normed;  // [T, H]: written by run
};

class MoeBlock {
 public:
  // Called with the block's named intermediates ("router_ids", "router_weights"), when it has them.
  using Observe = std::function<void(const std::string& name, const Tensor& t)>;

  virtual ~MoeBlock() = default;
  // Once per step, before the first layer, with the step's token count (a collective for a block
  // that must agree on sizes with other ranks).
  virtual void begin_step(int64_t tokens) = 0;
  // The MoE output (without the residual) of this rank's T rows of in.normed ([T, H]), after the
  // norm that makes them; the view stays valid until the next call.
  virtual Tensor run(const MoeInput& in, const Tensor& router_w, const Tensor& router_b, const ExpertWeights& experts,
                     const SwigluParams& swiglu, const Observe& observe) = 0;
};

// MoeDispatch::Replicate (docs/parallel.md): per layer
//   [dp > 1: ALL-GATHER the DP groups' rows, each padded to the largest group's count]
//   add_rmsnorm + router_topk (every row; one backend op without DP) -> moe (local experts, local intermediate slice)
//   -> [sharded MoE: ALL-REDUCE over the MoE ranks; dp > 1 with tp = 1: REDUCE-SCATTER, each rank
//      keeping its own rows] -> this rank's rows
class ReplicatedMoe final : public MoeBlock {
 public:
  // Plans the buffers for steps of up to `max_step_tokens` rows on this rank.
  ReplicatedMoe(Backend& backend, const GptOssConfig& config, const ModelShard& shard, int64_t max_step_tokens);

  void begin_step(int64_t tokens) override;
  Tensor run(const MoeInput& in, const Tensor& router_w, const Tensor& router_b, const ExpertWeights& experts,
             const SwigluParams& swiglu, const Observe& observe) override;

 private:
  Backend& backend_;
  int k_ = 0;
  int dp_size_ = 1, dp_rank_ = 0;
  Communicator* dp_ = nullptr;   // the ranks with this tp rank in every DP group (dp > 1)
  Communicator* moe_ = nullptr;  // every rank holding part of the MoE (null: unsharded experts)
  // With tp = 1 the MoE ranks are exactly the DP ranks in order: each keeps the sum of its own rows.
  bool reduce_scatter_ = false;
  int64_t tokens_ = 0, group_rows_ = 0;  // this step's rows, and every DP group's padded row count

  Tensor ids_, weights_, out_;  // [T, k] I32, [T, k] F32, [T, H]: this rank's rows
  // Data parallelism: every DP group's rows, each group padded to the largest (dp T rows).
  Tensor group_tokens_;  // [dp] F32 token counts
  Tensor in_all_, out_all_, ids_all_, weights_all_;
};

}  // namespace ossrt
