#pragma once
// The greedy screen: the argmax of ONE token row's logits over a bf16 unembedding [n, k] without
// reading all of its bf16 bytes (StepPlan::greedy_ids_only steps; docs/cuda_backend.md "The greedy
// screen"). The ids are exactly those of the bf16 GEMV's logits (bf16_gemv<1, 1>: argmax, NaN as -inf,
// lowest id on ties); the logits themselves are not written.
//
//   at load: w -> int8 codes with one fp32 scale per row (w_hat = code * scale), and per row
//     |w|, |w_hat| and |w - w_hat| (2-norms, rounded up).
//   1. scores: x -> int8 per 16 values (x_hat), A_r = x_hat . w_hat_r with DP4A (exact integer sums,
//      one fp32 multiply-add per 16 values), and a bound B_r >= |L_r - A_r| for the bf16 GEMV's logit
//      L_r: |x - x_hat| |w_r| + |x_hat| |w_r - w_hat_r| (Cauchy-Schwarz) plus the fp32 rounding of
//      both sums; writes U_r = A_r + B_r and the largest A_r - B_r (T) by an atomic max.
//   2. collect: the rows with U_r >= T (the argmax is one of them: L_argmax >= L_s >= A_s - B_s for
//      every s), up to kGreedyScreenMaxCandidates; more, or a non-finite x, and every row is one.
//   3. rescore: the candidates' exact logits with bf16_gemv<1, 1>'s arithmetic (gemv_common.cuh
//      gemv_rows_dot_one_token), offered to the fused greedy argmax's keys (greedy_argmax.cuh);
//   then launch_greedy_argmax_finish writes the id. Bytes: n k (int8) instead of 2 n k, plus the
//   candidates' rows.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels/greedy_argmax.cuh"

namespace ossrt::cuda {

inline constexpr int kGreedyScreenMaxCandidates = 8192;
inline constexpr int kGreedyScreenMaxK = 4096;  // 16 values a chunk, at most 8 chunks a lane

struct GreedyScreenWeights {
  const uint16_t* w = nullptr;  // bf16 [n, k]: the unembedding itself (rescored rows)
  int8_t* codes = nullptr;      // [n, k]
  float* scale = nullptr;       // [n]
  float* norm_w = nullptr;      // [n] |w_r|, rounded up
  float* norm_w_hat = nullptr;  // [n] |w_hat_r|, rounded up; +inf: a row with a non-finite weight
  float* norm_err = nullptr;    // [n] |w_r - w_hat_r|, rounded up
  int64_t n = 0;
  int k = 0;
};

// A step's state: `upper` [n], `candidates`, and kGreedyScreenWords words: the first
// kGreedyScreenZeroedWords are 0 between launches (the finish kernel zeroes them:
// GreedyArgmaxArgs::zero_after); the last says how many rows the last launch rescored (for tests).
inline constexpr int kGreedyScreenWords = 4, kGreedyScreenZeroedWords = 3;
enum GreedyScreenWord { kScreenThreshold = 0, kScreenFallback = 1, kScreenCount = 2, kScreenLastRescored = 3 };
struct GreedyScreenState {
  float* upper = nullptr;         // [n] U_r
  uint32_t* words = nullptr;      // [kGreedyScreenWords]: T's order key (0: none), fallback (non-zero:
                                  // every row is a candidate), candidates found, rows last rescored
  int32_t* candidates = nullptr;  // [kGreedyScreenMaxCandidates]
};

// Whether the screen takes an unembedding of these sizes (k a multiple of 16, at most
// kGreedyScreenMaxK; n below 2^31).
bool greedy_screen_supported(int64_t n, int k);
// Device bytes of the screen's copy of an [n, k] unembedding (codes and the per-row numbers) and of
// its per-step state.
size_t greedy_screen_weight_bytes(int64_t n, int k);
size_t greedy_screen_state_bytes(int64_t n);

// Fills codes, scale and the norms from g.w (at load, on `stream`).
void launch_greedy_screen_prepare(const GreedyScreenWeights& g, cudaStream_t stream);

// Steps 1-3 for the one token row x (bf16 [k]), then the finish kernel (keys.rows 1): keys.ids[0] is
// the id and the state is zeroed for the next launch. sms: the device's multiprocessor count.
void launch_greedy_screen(const GreedyScreenWeights& g, const GreedyScreenState& state, const uint16_t* x,
                          const GreedyArgmaxArgs& keys, int sms, cudaStream_t stream);

}  // namespace ossrt::cuda
