#include "bench/kernel_floors.h"

#include <algorithm>
#include <cmath>

namespace ossrt::bench {

OpCost embedding_cost(int64_t T, int64_t H) { return {double(T) * H * (kBf16 + kF32) + double(T) * kI32, 0}; }

OpCost rmsnorm_cost(int64_t T, int64_t H) { return {double(T) * H * (kF32 + kBf16) + double(H) * kBf16, 4.0 * T * H}; }

OpCost add_rmsnorm_cost(int64_t T, int64_t H) {
  return {double(T) * H * (2 * kF32 + 2 * kBf16) + double(H) * kBf16, 5.0 * T * H};
}

OpCost add_cost(int64_t T, int64_t H) { return {double(T) * H * (2 * kF32 + kBf16), double(T) * H}; }

OpCost linear_cost(int64_t M, int64_t N, int64_t K, bool bias, double out_bytes) {
  return {double(N) * K * kBf16 + double(M) * K * kBf16 + double(M) * N * out_bytes + (bias ? double(N) * kBf16 : 0.0),
          2.0 * M * N * K};
}

OpCost rope_cache_cost(int64_t T, int64_t q_heads, int64_t kv_heads, int64_t head_dim, double cache_bytes) {
  const double row = double(T) * head_dim;
  return {row * kBf16 * (2.0 * (q_heads + kv_heads) + kv_heads) + row * cache_bytes * 2.0 * kv_heads,
          6.0 * T * (q_heads + kv_heads) * head_dim / 2};
}

int64_t visible_keys(int64_t position, int64_t window) {
  return window > 0 ? std::min(position + 1, window) : position + 1;
}

OpCost attention_cost(int64_t seqs, int64_t q_tokens, int64_t context, int64_t window, int64_t q_heads,
                      int64_t kv_heads, int64_t head_dim, double cache_bytes) {
  double pairs = 0;  // (query, visible key) pairs of one sequence
  for (int64_t p = context; p < context + q_tokens; ++p) pairs += double(visible_keys(p, window));
  // Distinct keys read: from the first visible key of the first query to the last query.
  const int64_t first_key = window > 0 ? std::max<int64_t>(0, context - window + 1) : 0;
  const double keys = double(context + q_tokens - first_key);
  const double kv_bytes = keys * kv_heads * head_dim * cache_bytes * 2;       // K and V
  const double qo_bytes = double(q_tokens) * q_heads * head_dim * kBf16 * 2;  // q in, out
  return {double(seqs) * (kv_bytes + qo_bytes + q_heads * kBf16 /* sinks */),
          double(seqs) * pairs * q_heads * head_dim * 4.0};
}

OpCost router_cost(int64_t T, int64_t experts, int64_t H, int64_t k) {
  return {double(experts) * H * kBf16 + double(experts) * kBf16 + double(T) * H * kBf16 + double(T) * k * (kI32 + kF32),
          2.0 * T * experts * H};
}

OpCost moe_cost(int64_t T, int64_t k, double distinct_experts, int64_t H, int64_t I, double weight_bytes) {
  const double per_expert =
      double(2 * I) * H * weight_bytes + double(2 * I) * kF32 + double(H) * I * weight_bytes + double(H) * kF32;
  const double io = double(T) * H * kBf16 * 2 + double(T) * k * (kI32 + kF32);
  return {distinct_experts * per_expert + io, double(T) * k * 2.0 * (2.0 * I * H + double(H) * I)};
}

double expected_distinct_experts(int64_t T, int64_t experts, int64_t k) {
  if (experts <= 0) return 0;
  return double(experts) * (1.0 - std::pow(1.0 - double(k) / double(experts), double(T)));
}

OpCost gather_rows_cost(int64_t R, int64_t H) { return {double(R) * H * kF32 * 2 + double(R) * kI32, 0}; }

OpCost sample_cost(int64_t R, int64_t V) { return {double(R) * V * kF32 + double(R) * kI32, double(R) * V}; }

double floor_seconds(const OpCost& cost, double bytes_per_s, double flops_per_s) {
  const double mem = bytes_per_s > 0 ? cost.bytes / bytes_per_s : 0;
  const double math = flops_per_s > 0 ? cost.flops / flops_per_s : 0;
  return std::max(mem, math);
}

}  // namespace ossrt::bench
