#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cfloat>

#include "backend/cuda/kernels/sample.cuh"
#include "backend/cuda/kernels/sample_philox.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kRadixBins = 256;

// Order-preserving map float -> uint32 (larger float, larger key), so thresholds are exact keys.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One row of logits and its allowed-token mask (nullptr: every token allowed; else bit i % 32 of
// word i / 32 = token i allowed, the host Sampler's layout). The 32 threads of a warp read one mask
// word (a broadcast), and the row's 25 KB mask stays in L1/L2 across the passes below.
struct Row {
  const float* logits;
  const uint32_t* mask;

  __device__ __forceinline__ bool allowed(int i) const { return mask == nullptr || ((mask[i >> 5] >> (i & 31)) & 1u); }
  // Disallowed and NaN logits are -inf: they can never be sampled, and never poison the sums.
  __device__ __forceinline__ float at(int i) const {
    const float v = logits[i];
    return (v != v || !allowed(i)) ? -INFINITY : v;
  }
};

struct ArgMax {
  float value;
  int index;
};

struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.value > b.value || (a.value == b.value && a.index < b.index)) return a;
    return b;
  }
};

// Exact key of the k-th largest logit: 4 rounds of an 8-bit radix histogram, each narrowing the
// candidates to those sharing the already-decided high bytes.
__device__ uint32_t kth_largest_key(const Row& row, int vocab, int k, uint32_t* hist) {
  uint32_t prefix = 0, mask = 0;
  __shared__ uint32_t s_digit, s_remaining;
  uint32_t remaining = uint32_t(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kRadixBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const uint32_t key = order_key(row.at(i));
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t cum = 0, digit = 0;
      for (int b = kRadixBins - 1; b >= 0; --b) {
        if (cum + hist[b] >= remaining) {
          digit = uint32_t(b);
          break;
        }
        cum += hist[b];
      }
      s_digit = digit;
      s_remaining = remaining - cum;
    }
    __syncthreads();
    prefix |= s_digit << shift;
    mask |= 0xFFu << shift;
    remaining = s_remaining;
    __syncthreads();
  }
  return prefix;
}

// Key tau of the smallest set {key >= tau} (within keys >= floor_key) whose unnormalized mass
// reaches `target`: mass(key > tau) < target <= mass(key >= tau).
__device__ uint32_t top_p_key(const Row& row, int vocab, uint32_t floor_key, float target, float max_logit, float inv_t,
                              float* hist) {
  uint32_t prefix = 0, mask = 0;
  __shared__ uint32_t s_digit;
  __shared__ float s_target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kRadixBins; b += kThreads) hist[b] = 0.f;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = row.at(i);
      const uint32_t key = order_key(l);
      if (key >= floor_key && (key & mask) == prefix)
        atomicAdd(&hist[(key >> shift) & 0xFF], __expf((l - max_logit) * inv_t));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float cum = 0.f;
      int digit = -1, lowest_nonempty = 0;
      for (int b = kRadixBins - 1; b >= 0; --b) {
        if (hist[b] > 0.f) lowest_nonempty = b;
        if (digit < 0 && hist[b] > 0.f && cum + hist[b] >= target) {
          digit = b;
          s_target = target - cum;
        }
        if (digit < 0) cum += hist[b];
      }
      if (digit < 0) {  // rounding left the target just above the total: take the lowest bucket
        digit = lowest_nonempty;
        s_target = hist[digit];
      }
      s_digit = uint32_t(digit);
    }
    __syncthreads();
    prefix |= s_digit << shift;
    mask |= 0xFFu << shift;
    target = s_target;
    __syncthreads();
  }
  return prefix;
}

constexpr int kArgmaxThreads = 256;
static_assert(kSampleArgmaxSplits <= kThreads, "one partial result per sampling thread");

// Pass 1: CTA (split, row) finds the largest allowed logit of its contiguous share of the row (the
// lowest index among equals), or {-inf, INT32_MAX} when it has no allowed token.
__global__ void __launch_bounds__(kArgmaxThreads) f32_sample_argmax_partial(SampleArgs a) {
  using Reduce = cub::BlockReduce<ArgMax, kArgmaxThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int r = blockIdx.y, split = blockIdx.x;
  const SampleRowParams p = a.params[r];
  Row row{a.logits + int64_t(r) * a.vocab, p.mask_slot >= 0 ? a.masks + int64_t(p.mask_slot) * a.mask_words : nullptr};
  const int share = (a.vocab + kSampleArgmaxSplits - 1) / kSampleArgmaxSplits;
  const int begin = min(a.vocab, split * share), end = min(a.vocab, begin + share);
  ArgMax local{-INFINITY, INT32_MAX};
  for (int i = begin + int(threadIdx.x); i < end; i += kArgmaxThreads)
    if (row.allowed(i)) local = ArgMaxOp()(local, ArgMax{row.at(i), i});
  const ArgMax best = Reduce(tmp).Reduce(local, ArgMaxOp());
  if (threadIdx.x == 0) a.partials[int64_t(r) * kSampleArgmaxSplits + split] = {best.value, best.index};
}

__global__ void __launch_bounds__(kThreads) f32_sample_topk_topp(SampleArgs a) {
  using Reduce = cub::BlockReduce<ArgMax, kThreads>;
  using SumReduce = cub::BlockReduce<float, kThreads>;
  using Scan = cub::BlockScan<float, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename SumReduce::TempStorage sum;
    typename Scan::TempStorage scan;
    uint32_t hist_u[kRadixBins];
    float hist_f[kRadixBins];
  } smem;
  __shared__ ArgMax s_best;
  __shared__ float s_total;
  __shared__ int s_choice;

  const int r = blockIdx.x;
  const SampleRowParams p = a.params[r];
  const int vocab = a.vocab;
  Row row{a.logits + int64_t(r) * vocab, p.mask_slot >= 0 ? a.masks + int64_t(p.mask_slot) * a.mask_words : nullptr};

  // Only allowed tokens compete, so a disallowed id never wins a tie at -inf either. Pass 1's
  // partial results are reduced with the same operator, so the winner is the row's argmax.
  ArgMax local{-INFINITY, INT32_MAX};
  if (threadIdx.x < kSampleArgmaxSplits) {
    const SampleArgmaxPartial part = a.partials[int64_t(r) * kSampleArgmaxSplits + threadIdx.x];
    local = ArgMax{part.value, part.index};
  }
  const ArgMax best = Reduce(smem.reduce).Reduce(local, ArgMaxOp());
  if (threadIdx.x == 0) s_best = best;
  __syncthreads();
  if (s_best.index >= vocab) {
    // The mask allows no token of the vocabulary (block-uniform branch). The host Sampler then falls
    // back to the raw argmax whatever the temperature (sampler.cpp); so does this.
    row.mask = nullptr;
    ArgMax raw{-INFINITY, INT32_MAX};
    for (int i = threadIdx.x; i < vocab; i += kThreads) raw = ArgMaxOp()(raw, ArgMax{row.at(i), i});
    const ArgMax raw_best = Reduce(smem.reduce).Reduce(raw, ArgMaxOp());
    if (threadIdx.x == 0) a.out_ids[r] = raw_best.index < vocab ? raw_best.index : 0;
    return;
  }
  const int greedy = s_best.index;
  if (!(p.temperature > 0.f) || !isfinite(s_best.value)) {
    if (threadIdx.x == 0) a.out_ids[r] = greedy;
    return;
  }
  const float max_logit = s_best.value;
  const float inv_t = 1.0f / p.temperature;

  uint32_t floor_key = 0;  // keep every key >= floor_key
  if (p.top_k > 0 && p.top_k < vocab) floor_key = kth_largest_key(row, vocab, p.top_k, smem.hist_u);
  if (p.top_p > 0.f && p.top_p < 1.f) {
    float mass = 0.f;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = row.at(i);
      if (order_key(l) >= floor_key) mass += __expf((l - max_logit) * inv_t);
    }
    const float total = SumReduce(smem.sum).Sum(mass);
    if (threadIdx.x == 0) s_total = total;
    __syncthreads();
    const uint32_t tau = top_p_key(row, vocab, floor_key, p.top_p * s_total, max_logit, inv_t, smem.hist_f);
    floor_key = max(floor_key, tau);
  }

  // Inverse CDF in token-id order: each thread owns a contiguous chunk; a block scan of the chunk
  // masses finds the chunk holding the target, whose owner walks it.
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = min(vocab, int(threadIdx.x) * chunk), end = min(vocab, begin + chunk);
  float chunk_mass = 0.f;
  for (int i = begin; i < end; ++i) {
    const float l = row.at(i);
    if (order_key(l) >= floor_key) chunk_mass += __expf((l - max_logit) * inv_t);
  }
  float before = 0.f, total = 0.f;
  __syncthreads();
  Scan(smem.scan).ExclusiveSum(chunk_mass, before, total);
  if (threadIdx.x == 0) s_choice = -1;
  __syncthreads();
  const float target = philox_uniform(p.seed_lo, p.seed_hi, p.offset) * total;
  if (chunk_mass > 0.f && target >= before && target < before + chunk_mass) {
    float acc = before;
    int last_kept = -1, choice = -1;
    for (int i = begin; i < end && choice < 0; ++i) {
      const float l = row.at(i);
      if (order_key(l) < floor_key) continue;
      const float w = __expf((l - max_logit) * inv_t);
      // -inf (disallowed) or underflowed: outside the support, so never the edge fallback either.
      if (!(w > 0.f)) continue;
      last_kept = i;
      acc += w;
      if (target < acc) choice = i;
    }
    s_choice = choice >= 0 ? choice : last_kept;  // float re-association can leave target at the edge
  }
  __syncthreads();
  if (threadIdx.x == 0) a.out_ids[r] = s_choice >= 0 ? s_choice : greedy;
}

}  // namespace

cudaError_t launch_f32_sample_topk_topp(const SampleArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return cudaSuccess;
  f32_sample_argmax_partial<<<dim3(kSampleArgmaxSplits, args.rows), kArgmaxThreads, 0, stream>>>(args);
  f32_sample_topk_topp<<<args.rows, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ossrt::cuda
