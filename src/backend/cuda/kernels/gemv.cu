// The small-M linears of gemv.cuh. 2 to 8 rows and K a multiple of 32 (every gpt-oss linear):
// bf16_gemv_mma, on tensor cores. One row, or other K: bf16_gemv, a 256-thread CTA of 8 warps owns 8 / kWarpsPerRow
// output rows (gemv_common.cuh: how a row's dot products are split and summed), one warp per row when there are enough
// rows to fill the GPU, a whole CTA per row when there are few. Both offer their outputs to the fused greedy argmax
// when asked (GemvArgs::greedy: the unembedding of a decode step, greedy_argmax.cuh).
#include <algorithm>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/gemv.cuh"
#include "backend/cuda/kernels/gemv_common.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
static_assert(kWarps == 8, "gemv_one_warp_per_row (gemv.cuh) counts 8 rows a CTA");

// One row, a warp per row: at most 48 registers, so 5 CTAs (40 warps) fit an SM and QKV's 5,120 rows
// are one wave on 132 SMs (4 CTAs at the 51 registers it takes unbounded: 1.2 waves, the last one
// a fifth full).
template <int kM, int kWarpsPerRow>
__global__ void __launch_bounds__(kThreads, kM == 1 && kWarpsPerRow == 1 ? 5 : 1) bf16_gemv(GemvArgs a) {
  constexpr int kRowsPerCta = kWarps / kWarpsPerRow;
  const int row = blockIdx.x * kRowsPerCta + int(threadIdx.x / 32) / kWarpsPerRow;
  const bool row_ok = row < a.n;
  float acc[kM];
  if (!gemv_row_dot<kM, kWarpsPerRow, kWarps>(a.x, a.w + int64_t(row_ok ? row : 0) * a.k, row_ok, a.k, a.m, acc))
    return;
  const float bias = a.bias ? bf16_bits_to_float(a.bias[row]) : 0.f;
#pragma unroll
  for (int r = 0; r < kM; ++r) {
    if (r >= a.m) break;
    const float y = acc[r] + bias;
    if (a.out_f32)
      static_cast<float*>(a.out)[int64_t(r) * a.n + row] = y;
    else
      reinterpret_cast<__nv_bfloat16*>(a.out)[int64_t(r) * a.n + row] = __float2bfloat16_rn(y);
    if (a.greedy.keys) greedy_offer(a.greedy, r, greedy_key(y, row));
  }
}

// bf16_gemv_mma: K a multiple of 32. A CTA owns 16 weight rows at a time (a grid-stride loop over
// row tiles, at most one resident wave of CTAs) and its 8 warps split K in 32-wide chunks (chunk j
// to warp j % 8). The weights are the MMA's A operand (16 rows, the wide side) and the token rows
// its B operand (n = 8), so 1 to 8 rows cost the same and x is read once per 16 weight rows, not
// once per row (the FMA kernel above is L1-bound from 4 rows). No repacked layout: lane (g, c) loads
// 16 bytes of weight rows g and g + 8 and of token row g at columns 8c .. 8c + 7 of the chunk, and
// the two m16n8k16 steps of a chunk take words (0, 1) and (2, 3) of those loads; a chunk's 32
// columns are thereby permuted identically in A and B, which a dot product does not see. Partial
// sums meet in shared memory in warp order: a row's result depends only on its own data.
constexpr int kMmaRows = 16;
constexpr int kMmaBatch = 4;  // 32-column chunks in flight per warp

__global__ void __launch_bounds__(kThreads) bf16_gemv_mma(GemvArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int chunks = a.k / 32;
  const int tiles = (a.n + kMmaRows - 1) / kMmaRows;
  // The first tile's weights do not depend on the previous kernel: pull them into L2 while it runs.
  if (int(blockIdx.x) < tiles) {
    const int r0 = blockIdx.x * kMmaRows;
    for (int kc = warp; kc < chunks; kc += kWarps) {
      if (r0 + g < a.n) prefetch_l2(a.w + int64_t(r0 + g) * a.k + kc * 32 + 8 * c);
      if (r0 + g + 8 < a.n) prefetch_l2(a.w + int64_t(r0 + g + 8) * a.k + kc * 32 + 8 * c);
    }
  }
  pdl_wait();
  pdl_launch_dependents();
  const bool token_ok = g < a.m;
  const uint16_t* xrow = a.x + int64_t(token_ok ? g : 0) * a.k + 8 * c;
  __shared__ float red[kWarps][4][32];
  // Warp 0's lane (g, c): the greedy keys of tokens 2c and 2c + 1 over the rows it wrote, offered
  // once after the last tile (a CTA's few offers rather than 4 a lane a tile).
  unsigned long long best[2] = {0ull, 0ull};
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int r_lo = tile * kMmaRows + g, r_hi = r_lo + 8;
    const bool lo_ok = r_lo < a.n, hi_ok = r_hi < a.n;
    const uint16_t* w_lo = a.w + int64_t(lo_ok ? r_lo : 0) * a.k + 8 * c;
    const uint16_t* w_hi = a.w + int64_t(hi_ok ? r_hi : 0) * a.k + 8 * c;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int kc0 = warp; kc0 < chunks; kc0 += kWarps * kMmaBatch) {
      uint4 wl[kMmaBatch], wh[kMmaBatch], xv[kMmaBatch];
#pragma unroll
      for (int b = 0; b < kMmaBatch; ++b) {
        const int kc = kc0 + b * kWarps;
        const bool in = kc < chunks;
        wl[b] = in && lo_ok ? ldg_stream(w_lo + kc * 32) : make_uint4(0, 0, 0, 0);
        wh[b] = in && hi_ok ? ldg_stream(w_hi + kc * 32) : make_uint4(0, 0, 0, 0);
        xv[b] = in && token_ok ? __ldg(reinterpret_cast<const uint4*>(xrow + kc * 32)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int b = 0; b < kMmaBatch; ++b) {
        if (kc0 + b * kWarps >= chunks) break;  // warp-uniform
        const uint32_t a0[4] = {wl[b].x, wh[b].x, wl[b].y, wh[b].y}, b0[2] = {xv[b].x, xv[b].y};
        const uint32_t a1[4] = {wl[b].z, wh[b].z, wl[b].w, wh[b].w}, b1[2] = {xv[b].z, xv[b].w};
        mma_bf16_m16n8k16(acc, a0, b0);
        mma_bf16_m16n8k16(acc, a1, b1);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
    __syncthreads();
    if (warp == 0) {
      float s[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[i] = red[0][i][lane];
        for (int w = 1; w < kWarps; ++w) s[i] += red[w][i][lane];
      }
      // s[0], s[1]: row r_lo, tokens 2c and 2c + 1; s[2], s[3]: row r_hi, the same tokens.
      const float b_lo = a.bias && lo_ok ? bf16_bits_to_float(a.bias[r_lo]) : 0.f;
      const float b_hi = a.bias && hi_ok ? bf16_bits_to_float(a.bias[r_hi]) : 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int token = 2 * c + (i & 1), row = i < 2 ? r_lo : r_hi;
        if (token >= a.m || row >= a.n) continue;
        const float y = s[i] + (i < 2 ? b_lo : b_hi);
        if (a.out_f32)
          static_cast<float*>(a.out)[int64_t(token) * a.n + row] = y;
        else
          reinterpret_cast<__nv_bfloat16*>(a.out)[int64_t(token) * a.n + row] = __float2bfloat16_rn(y);
        if (a.greedy.keys) {
          const unsigned long long key = greedy_key(y, row);
          if (key > best[i & 1]) best[i & 1] = key;
        }
      }
    }
    __syncthreads();  // red is reused by the next tile
  }
  if (warp == 0 && a.greedy.keys) greedy_offer_token_pairs(a.greedy, best, 0, a.m);
}

using GemvKernel = void (*)(GemvArgs);

template <int kWarpsPerRow>
GemvKernel pick_rows(int m) {
  if (m == 1) return bf16_gemv<1, kWarpsPerRow>;
  if (m == 2) return bf16_gemv<2, kWarpsPerRow>;
  if (m <= 4) return bf16_gemv<4, kWarpsPerRow>;
  return bf16_gemv<8, kWarpsPerRow>;
}

}  // namespace

bool gemv_supported(const GemvArgs& a) {
  return a.m >= 1 && a.m <= kGemvMaxRows && a.n >= 1 && a.k >= 8 && a.k % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
}

void launch_bf16_gemv(const GemvArgs& a, int sms, cudaStream_t stream) {
  OSSRT_CU_CHECK(gemv_supported(a), "bf16_gemv: m ", a.m, " n ", a.n, " k ", a.k,
                 " (m 1..8, k a multiple of 8, 16-byte aligned x and w)");
  OSSRT_CU_CHECK(sms > 0, "bf16_gemv: ", sms, " multiprocessors");
  OSSRT_CU_CHECK(!a.greedy.keys || (a.out_f32 && a.greedy.rows == a.m),
                 "bf16_gemv: the fused greedy argmax needs f32 outputs and the GEMV's token rows (", a.greedy.rows,
                 " for ", a.m, ")");
  // One row: the FMA kernel (measured on the H200 in a decode step: 2.10 ms against 2.18 with the MMA
  // one at batch 1); 2 to 8 rows: the MMA one (the FMA kernel is L1-bound there: 5.9 ms at batch 8).
  if (a.k % 32 == 0 && a.m >= 2) {
    static const int per_sm = [] {
      int blocks = 0;
      OSSRT_CUDA_CALL(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, bf16_gemv_mma, kThreads, 0));
      return blocks;
    }();
    const int tiles = (a.n + kMmaRows - 1) / kMmaRows;
    const dim3 grid(std::min(tiles, std::max(1, per_sm) * sms));
    OSSRT_CUDA_CALL(launch_pdl(bf16_gemv_mma, grid, dim3(kThreads), stream, a));
    return;
  }
  // A warp per row needs n / 8 CTAs to cover the SMs a few times over; with fewer rows (the router)
  // every warp of a CTA takes a slice of one row's K.
  const bool few_rows = !gemv_one_warp_per_row(a.n, sms);
  const GemvKernel kernel = few_rows ? pick_rows<kWarps>(a.m) : pick_rows<1>(a.m);
  const int rows_per_cta = few_rows ? 1 : kWarps;
  const dim3 grid((a.n + rows_per_cta - 1) / rows_per_cta);
  OSSRT_CUDA_CALL(launch_pdl(kernel, grid, dim3(kThreads), stream, a));
}

}  // namespace ossrt::cuda
