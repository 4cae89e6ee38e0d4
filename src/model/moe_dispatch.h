#pragma once
// All-to-all expert dispatch for one rank (MoeDispatch::AllToAll; docs/parallel.md, "Expert dispatch").
//
// The step's T rows (a DP group's rows with data parallelism, else every row) are held identically by
// the n ranks of a "row group" (the DP group's tensor-parallel ranks, or the whole world). Each of
// them takes its own contiguous slice of c = ceil(T / n) rows (so some ranks may have none), and:
//   1. routes its rows (router_topk);
//   2. tells every rank how many (token, slot) pairs it will send it (all_gather of the counts: the
//      fixed-size all_to_all pads each chunk to the largest count, which every rank then knows);
//   3. sends each pair's hidden row, with its router weight and global expert id, to every rank of
//      the expert's group (all_to_all; with expert_tp_size > 1 each holds a slice of the expert);
//   4. runs its local experts on what it received (Backend::moe, one slot per row), which yields the
//      weighted output, and sends it back (second all_to_all, same positions);
//   5. sums each of its rows' k (x slices) contributions in slot order (Backend::sum_rows), so the
//      result does not depend on timing: with one slice per expert it is bitwise the unsharded sum;
//   6. all-gathers the slices within the row group, so every rank again holds all T rows.
// No all-reduce of the MoE output.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "config/gpt_oss_config.h"
#include "model/moe_block.h"

namespace ossrt {

struct ModelShard;

class MoeDispatcher final : public MoeBlock {
 public:
  // Plans the exchange buffers for steps of up to `max_step_tokens` rows.
  MoeDispatcher(Backend& backend, const GptOssConfig& config, const ModelShard& shard, int64_t max_step_tokens);

  void begin_step(int64_t /*tokens*/) override {}  // each layer's exchange agrees on its own sizes
  // MoE output of all T rows of `normed` ([T, H]); the view stays valid until the next call. The
  // routing is per own rows and never whole, so nothing is observed.
  Tensor run(const MoeInput& input, const Tensor& router_w, const Tensor& router_b, const ExpertWeights& experts,
             const SwigluParams& swiglu, const Observe& observe) override;

 private:
  // Rows [begin, begin + count) of a T-row step are this rank's; slice = ceil(T / n) rows per rank.
  struct OwnRows {
    int64_t begin = 0, count = 0, slice = 0;
  };
  OwnRows own_rows(int64_t tokens) const;
  // Steps 1-2: routes the own rows and fills send_rows_/combine_index_; returns the chunk size.
  int64_t plan_exchange(const Tensor& normed, const OwnRows& own, const Tensor& router_w, const Tensor& router_b);
  // Step 4: the local experts on every received chunk.
  void run_local_experts(int64_t chunk, const ExpertWeights& experts, const SwigluParams& swiglu);

  Backend& backend_;
  Communicator* world_;  // every MoE rank, in rank order
  Communicator* rows_;   // the ranks holding the same rows (null: this rank alone)
  int world_size_ = 1, rank_ = 0, row_group_size_ = 1, row_group_rank_ = 0;
  int k_ = 0;
  int64_t hidden_ = 0, experts_per_group_ = 0, expert_tp_ = 1;
  int64_t first_local_expert_ = 0, local_experts_ = 0;

  // Backend buffers, sized for the largest step (see the constructor).
  Tensor ids_, weights_;              // [c, k] this rank's routing
  Tensor counts_, count_matrix_;      // [world] F32 pairs sent to each rank; [world, world] everybody's
  Tensor send_, recv_;                // [world * chunk, H] hidden rows out / in
  Tensor meta_send_, meta_recv_;      // [world * chunk, 2] (router weight, global expert id) per row
  Tensor recv_ids_, recv_weights_;    // [world * chunk, 1] I32 / F32, the received meta for Backend::moe
  Tensor result_send_, result_recv_;  // [world * chunk, H] weighted expert outputs back / home
  Tensor combined_;                   // [c, H] this rank's rows' MoE output
  Tensor gathered_;                   // [n * c, H] the row group's rows, first T valid

  // Host scratch, kept to avoid reallocating every layer.
  std::vector<int32_t> host_ids_, send_rows_, combine_index_, recv_ids_host_;
  std::vector<float> host_weights_, meta_host_, matrix_host_, recv_weights_host_;
  std::vector<int64_t> matrix_;  // count_matrix_ as integers: [src * world + dst]
};

}  // namespace ossrt
