// The greedy screen's kernels (greedy_screen.cuh has the method and its bound).
#include <algorithm>
#include <cfloat>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/gemv_common.cuh"
#include "backend/cuda/kernels/greedy_screen.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 16;                                          // values a lane-chunk (16 codes)
constexpr int kMaxChunksPerLane = kGreedyScreenMaxK / kChunk / 32;  // 8
// Relative fp32 rounding of a sum of at most kGreedyScreenMaxK products, both the bf16 GEMV's and
// the screen's (K 2^-24 ~ 2.4e-4 at K = 4,096, with room), and of the norms (computed, then
// multiplied by kRoundUp).
constexpr float kGamma = 3e-4f;
constexpr float kRoundUp = 1.001f;

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// The 16 bf16 values of chunk c of a row, as floats.
__device__ __forceinline__ void load_chunk_f32(const uint16_t* row, int c, float (&v)[kChunk]) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(row + c * kChunk));
  const uint4 b = __ldg(reinterpret_cast<const uint4*>(row + c * kChunk + 8));
  const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) v[2 * i] = bf16_lo(words[i]), v[2 * i + 1] = bf16_hi(words[i]);
}

// Symmetric int8 codes of 16 values at `scale` (code = round(v / scale) within +-127; all 0 when the
// scale is 0), packed four to a word in value order; v^2, v_hat^2 and (v - v_hat)^2 added to the sums,
// in double: squares of floats neither underflow nor overflow there (a bound made of fp32 squares of
// values near 1e-20 would be 0).
__device__ __forceinline__ void encode_chunk(const float (&v)[kChunk], float scale, uint32_t (&q)[4], double& sum_v,
                                             double& sum_hat, double& sum_err) {
#pragma unroll
  for (int j = 0; j < 4; ++j) q[j] = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const float code = scale > 0.f ? fminf(fmaxf(rintf(v[i] / scale), -127.f), 127.f) : 0.f;
    const double hat = double(code) * double(scale);  // exact: 8 x 24 bits
    const double err = double(v[i]) - hat;            // exact to double's rounding
    sum_v = fma(double(v[i]), double(v[i]), sum_v);
    sum_hat = fma(hat, hat, sum_hat);
    sum_err = fma(err, err, sum_err);
    q[i / 4] |= (uint32_t(int32_t(code)) & 0xFFu) << (8 * (i % 4));
  }
}

// A norm from its double sum of squares as a float no smaller than it (overflow: +inf; a positive
// norm below FLT_MIN: FLT_MIN), so every bound made of it stays a bound.
__device__ __forceinline__ float norm_up(double sum_sq) {
  const double n = sqrt(sum_sq) * double(kRoundUp);
  if (n <= 0.0) return 0.f;
  return n >= double(FLT_MAX) ? INFINITY : fmaxf(float(n) * kRoundUp, FLT_MIN);
}

__device__ __forceinline__ double warp_sum_double(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float max_abs(const float (&v)[kChunk]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) m = fmaxf(m, fabsf(v[i]));
  return m;
}

__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_to_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// Load time: a warp a row (grid-stride). A row with a non-finite weight gets codes 0 and
// norm_w_hat = +inf, which makes it a candidate at every step (its bf16 logit decides).
__global__ void __launch_bounds__(kThreads) greedy_screen_prepare(GreedyScreenWeights g) {
  const int lane = threadIdx.x % 32;
  const int chunks = g.k / kChunk;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; r < g.n; r += int64_t(gridDim.x) * kWarps) {
    const uint16_t* row = g.w + r * g.k;
    float m = 0.f;
    bool finite = true;
    for (int c = lane; c < chunks; c += 32) {
      float v[kChunk];
      load_chunk_f32(row, c, v);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) finite = finite && isfinite(v[i]);
      m = fmaxf(m, max_abs(v));
    }
    m = warp_max(m);
    finite = __all_sync(0xffffffffu, finite);
    const float scale = finite && m > 0.f ? m / 127.f : 0.f;
    double sum_v = 0.0, sum_hat = 0.0, sum_err = 0.0;
    for (int c = lane; c < chunks; c += 32) {
      float v[kChunk];
      load_chunk_f32(row, c, v);
      uint32_t q[4];
      encode_chunk(v, scale, q, sum_v, sum_hat, sum_err);
      *reinterpret_cast<uint4*>(g.codes + r * g.k + c * kChunk) = make_uint4(q[0], q[1], q[2], q[3]);
    }
    sum_v = warp_sum_double(sum_v), sum_hat = warp_sum_double(sum_hat), sum_err = warp_sum_double(sum_err);
    if (lane == 0) {
      g.scale[r] = scale;
      g.norm_w[r] = finite ? norm_up(sum_v) : 0.f;
      g.norm_w_hat[r] = finite ? norm_up(sum_hat) : INFINITY;
      g.norm_err[r] = finite ? norm_up(sum_err) : 0.f;
    }
  }
}

// Step 1, a warp a row (grid-stride over a resident grid). The CTA first quantizes x into shared
// memory (thread c: chunk c, its codes and scale), then each warp streams its rows' codes (lane l: the
// row's chunks l, l + 32, ...), requesting the next row's before this row's sums meet.
__global__ void __launch_bounds__(kThreads, 3)
    greedy_screen_scores(GreedyScreenWeights g, GreedyScreenState st, const uint16_t* x) {
  static_assert(kGreedyScreenMaxK / kChunk <= kThreads, "a thread a chunk of x");
  __shared__ uint4 xq_s[kGreedyScreenMaxK / kChunk];
  __shared__ float xs_s[kGreedyScreenMaxK / kChunk];
  __shared__ double sums_s[kWarps][3];
  __shared__ bool finite_s[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = g.k / kChunk;
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  int64_t r = int64_t(blockIdx.x) * kWarps + warp;
  uint4 codes[kMaxChunksPerLane];
  float row_scale = 0.f, row_w = 0.f, row_w_hat = 0.f, row_err = 0.f;  // lane 0's copy of row r's numbers
  auto load_row = [&](int64_t row) {
#pragma unroll
    for (int i = 0; i < kMaxChunksPerLane; ++i) {
      const int c = lane + 32 * i;
      codes[i] = row < g.n && c < chunks ? ldg_stream(g.codes + row * g.k + c * kChunk) : make_uint4(0, 0, 0, 0);
    }
    if (lane == 0 && row < g.n)
      row_scale = g.scale[row], row_w = g.norm_w[row], row_w_hat = g.norm_w_hat[row], row_err = g.norm_err[row];
  };
  load_row(r);  // the codes and norms are weights: no kernel of the step writes them
  pdl_wait();
  pdl_launch_dependents();

  double sum_x = 0.0, sum_hat = 0.0, sum_err = 0.0;
  bool finite = true;
  if (int(threadIdx.x) < chunks) {
    float v[kChunk];
    load_chunk_f32(x, int(threadIdx.x), v);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) finite = finite && isfinite(v[e]);
    const float m = max_abs(v);
    const float scale = m > 0.f ? m / 127.f : 0.f;
    uint32_t q[4];
    encode_chunk(v, scale, q, sum_x, sum_hat, sum_err);
    xq_s[threadIdx.x] = make_uint4(q[0], q[1], q[2], q[3]);
    xs_s[threadIdx.x] = scale;
  }
  sum_x = warp_sum_double(sum_x), sum_hat = warp_sum_double(sum_hat), sum_err = warp_sum_double(sum_err);
  finite = __all_sync(0xffffffffu, finite);
  if (lane == 0) sums_s[warp][0] = sum_x, sums_s[warp][1] = sum_hat, sums_s[warp][2] = sum_err, finite_s[warp] = finite;
  __syncthreads();
  sum_x = sum_hat = sum_err = 0.0;
  for (int w = 0; w < kWarps; ++w) {  // every thread, in the same order: the same bits
    sum_x += sums_s[w][0], sum_hat += sums_s[w][1], sum_err += sums_s[w][2];
    finite = finite && finite_s[w];
  }
  const float nx = norm_up(sum_x), nx_hat = norm_up(sum_hat), ex = norm_up(sum_err);
  if (!finite || !isfinite(nx)) {  // no bound holds: every row is a candidate
    if (threadIdx.x == 0) atomicExch(st.words + kScreenFallback, 1u);
    return;
  }
  float best_lower = -INFINITY;
  for (; r < g.n; r += stride) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxChunksPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c >= chunks) break;
      const uint4 xq = xq_s[c];
      int s = __dp4a(int(codes[i].x), int(xq.x), 0);
      s = __dp4a(int(codes[i].y), int(xq.y), s);
      s = __dp4a(int(codes[i].z), int(xq.z), s);
      s = __dp4a(int(codes[i].w), int(xq.w), s);
      acc = fmaf(float(s), xs_s[c], acc);  // |s| <= 16 * 127 * 127: exact in fp32
    }
    const float scale = row_scale, w = row_w, w_hat = row_w_hat, err = row_err;
    const int64_t here = r;
    load_row(r + stride);
    acc = warp_sum(acc);
    if (lane == 0) {
      float upper = INFINITY, lower = -INFINITY;  // a row with a non-finite weight: always a candidate
      if (w_hat < INFINITY) {
        const float a = acc * scale;
        const float b =
            (ex * w + nx_hat * err + kGamma * (nx * w + nx_hat * w_hat)) * kRoundUp + fabsf(a) * 4e-7f + FLT_MIN;
        upper = a + b;
        lower = a - b;
      }
      st.upper[here] = upper;
      best_lower = fmaxf(best_lower, lower);
    }
  }
  if (lane == 0 && best_lower > -INFINITY) atomicMax(st.words + kScreenThreshold, order_key(best_lower));
}

// Step 2: the rows whose upper bound reaches T, in any order, up to kGreedyScreenMaxCandidates.
__global__ void __launch_bounds__(kThreads) greedy_screen_collect(GreedyScreenWeights g, GreedyScreenState st) {
  pdl_wait();
  pdl_launch_dependents();
  if (st.words[kScreenFallback] != 0) return;  // the rescore takes every row
  const uint32_t key = st.words[kScreenThreshold];
  const float t = key == 0 ? -INFINITY : key_to_float(key);  // no finite lower bound: every row
  for (int64_t r = int64_t(blockIdx.x) * kThreads + threadIdx.x; r < g.n; r += int64_t(gridDim.x) * kThreads) {
    if (st.upper[r] < t) continue;  // a NaN bound (overflowed arithmetic) keeps the row
    const uint32_t i = atomicAdd(st.words + kScreenCount, 1u);
    if (i < uint32_t(kGreedyScreenMaxCandidates)) st.candidates[i] = int32_t(r);
  }
}

// Step 3: each candidate's logit exactly as bf16_gemv<1, 1> computes it (a warp a row, the same lane
// split, FMA order and shuffles: gemv_rows_dot_one_token), offered to the greedy keys. Every row when
// the screen fell back or found more candidates than it keeps.
__global__ void __launch_bounds__(kThreads)
    greedy_screen_rescore(GreedyScreenWeights g, GreedyScreenState st, const uint16_t* x, GreedyArgmaxArgs keys) {
  pdl_wait();
  pdl_launch_dependents();
  const uint32_t found = st.words[kScreenCount];
  const bool every_row = st.words[kScreenFallback] != 0 || found > uint32_t(kGreedyScreenMaxCandidates);
  const int64_t items = every_row ? g.n : int64_t(found);
  if (blockIdx.x == 0 && threadIdx.x == 0) st.words[kScreenLastRescored] = uint32_t(items);  // n < 2^31
  const int lane = threadIdx.x % 32;
  for (int64_t i = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; i < items; i += int64_t(gridDim.x) * kWarps) {
    const int64_t row = every_row ? i : int64_t(st.candidates[i]);
    const uint16_t* const w[1] = {g.w + row * g.k};
    float sum[1];
    gemv_rows_dot_one_token<1>(x, w, g.k, sum);
    if (lane == 0) greedy_offer(keys, 0, greedy_key(sum[0] + 0.f, int(row)));  // + bias 0, as bf16_gemv
  }
}

}  // namespace

bool greedy_screen_supported(int64_t n, int k) {
  return n >= 1 && n < (int64_t(1) << 31) && k >= kChunk && k % kChunk == 0 && k <= kGreedyScreenMaxK;
}

size_t greedy_screen_weight_bytes(int64_t n, int k) { return size_t(n) * size_t(k) + 4 * size_t(n) * sizeof(float); }

size_t greedy_screen_state_bytes(int64_t n) {
  return size_t(n) * sizeof(float) + kGreedyScreenWords * sizeof(uint32_t) +
         size_t(kGreedyScreenMaxCandidates) * sizeof(int32_t);
}

void launch_greedy_screen_prepare(const GreedyScreenWeights& g, cudaStream_t stream) {
  OSSRT_CU_CHECK(
      greedy_screen_supported(g.n, g.k) && g.w && g.codes && g.scale && g.norm_w && g.norm_w_hat && g.norm_err,
      "greedy screen: an unembedding of ", g.n, " x ", g.k, " (k a multiple of ", kChunk, ", at most ",
      kGreedyScreenMaxK, ") or a missing buffer");
  const int64_t ctas = std::min<int64_t>((g.n + kWarps - 1) / kWarps, 65535);
  greedy_screen_prepare<<<unsigned(ctas), kThreads, 0, stream>>>(g);
  OSSRT_CHECK_LAUNCH("greedy_screen_prepare");
}

void launch_greedy_screen(const GreedyScreenWeights& g, const GreedyScreenState& st, const uint16_t* x,
                          const GreedyArgmaxArgs& keys, int sms, cudaStream_t stream) {
  OSSRT_CU_CHECK(greedy_screen_supported(g.n, g.k) && st.upper && st.words && st.candidates && x && sms > 0 &&
                     keys.rows == 1 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
                 "greedy screen: one 16-byte aligned token row over ", g.n, " x ", g.k, ", its state and ", sms,
                 " multiprocessors");
  const unsigned collect = unsigned(std::min<int64_t>((g.n + kThreads - 1) / kThreads, int64_t(sms) * 8));
  OSSRT_CUDA_CALL(launch_pdl(greedy_screen_scores, dim3(unsigned(sms) * 3), dim3(kThreads), stream, g, st, x));
  OSSRT_CUDA_CALL(launch_pdl(greedy_screen_collect, dim3(collect), dim3(kThreads), stream, g, st));
  OSSRT_CUDA_CALL(launch_pdl(greedy_screen_rescore, dim3(unsigned(sms) * 4), dim3(kThreads), stream, g, st, x, keys));
  GreedyArgmaxArgs finish = keys;
  finish.zero_after = st.words;
  finish.zero_words = kGreedyScreenZeroedWords;
  launch_greedy_argmax_finish(finish, stream);
}

}  // namespace ossrt::cuda
