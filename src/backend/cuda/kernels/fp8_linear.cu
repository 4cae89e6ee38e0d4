// The FP8 block-scaled linears of fp8_linear.cuh: the activation quantizer and the small-M GEMV.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/fp8_linear.cuh"
#include "backend/cuda/kernels/fp8_quant.cuh"
#include "backend/cuda/kernels/rope_common.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// 16-byte weight chunks in flight per lane: 2 with one token row (the registers of 5 CTAs an SM;
// the rest of the row is already on its way into L2), 4 with more.
constexpr int batch_for_rows(int rows) { return rows == 1 ? 2 : 4; }
constexpr int kChunk = 16;  // columns (bytes) a lane loads at once; 8 chunks a 128-column block
constexpr size_t kMaxSmemBytes = size_t(200) << 10;
// Exact powers of two that keep every product of the GEMV in float32's normal range: weights are
// decoded to 2^-120 times their e4m3 value (a bit move, below), activations stored as 2^112 times
// theirs, so a product is 2^-8 times the true one; the block sum is scaled back by 2^8.
constexpr float kActivationBias = 0x1p112f;
constexpr float kProductUnbias = 0x1p8f;

// Channels 4l .. 4l + 3 of group g of token row `tok` (zeros past k or past m).
__device__ __forceinline__ void load_group_lane(const uint16_t* x, int m, int k, int tok, int g, float (&v)[4]) {
  const int col = g * kFp8Block + 4 * int(threadIdx.x % 32);
  const uint16_t* p = x + int64_t(tok) * k + col;
  if (tok < m && k % 4 == 0 && col < k) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = unpack_bf16x2(u.x), b = unpack_bf16x2(u.y);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = tok < m && col + j < k ? bf16_bits_to_float(p[j]) : 0.0f;
}

// kQuantTasks 128-channel groups by one warp at once, lane l holding channels 4l .. 4l + 3 of each:
// the rule of core/fp8.h exactly (scale = max|v| / 448 in fp32, fmaxf ignoring a NaN as std::max does
// there; fp8_codes_at). The loads and the shuffle reductions of independent groups interleave (one at a time, a GEMV
// CTA's quantization was a chain of dependent latencies longer than its weights' streaming). Task i: group g[i] of
// token row tok[i]; a row at or past m loads nothing and gets scale 0.
constexpr int kQuantTasks = 4;
template <int kQuantTasks>
__device__ __forceinline__ void fp8_quantize_groups(const uint16_t* x, int m, int k, const int (&tok)[kQuantTasks],
                                                    const int (&g)[kQuantTasks], uint8_t (&code)[kQuantTasks][4],
                                                    float (&scale)[kQuantTasks]) {
  float v[kQuantTasks][4], amax[kQuantTasks];
#pragma unroll
  for (int i = 0; i < kQuantTasks; ++i) load_group_lane(x, m, k, tok[i], g[i], v[i]);
#pragma unroll
  for (int i = 0; i < kQuantTasks; ++i) amax[i] = fp8_lane_amax(v[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int i = 0; i < kQuantTasks; ++i) amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], o));
#pragma unroll
  for (int i = 0; i < kQuantTasks; ++i) {
    scale[i] = fp8_scale_of_amax(amax[i]);
    fp8_codes_at(v[i], scale[i], code[i]);
  }
}

__global__ void __launch_bounds__(kThreads) bf16_fp8_quantize_rows(Fp8QuantizeArgs a) {
  const int tok = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kb_pad = a.k_pad / kFp8Block;
  for (int g0 = warp; g0 < kb_pad; g0 += kWarps * kQuantTasks) {
    int toks[kQuantTasks], g[kQuantTasks];
#pragma unroll
    for (int i = 0; i < kQuantTasks; ++i) {
      g[i] = g0 + i * kWarps;
      toks[i] = g[i] < kb_pad ? tok : a.m;
    }
    uint8_t code[kQuantTasks][4];
    float s[kQuantTasks];
    fp8_quantize_groups<kQuantTasks>(a.x, a.m, a.k, toks, g, code, s);
#pragma unroll
    for (int i = 0; i < kQuantTasks; ++i) {
      if (g[i] >= kb_pad) break;
      fp8_store_group(a.codes, a.scales, a.m, a.k_pad, a.token_major, a.chunk_rows, tok, g[i], lane, code[i], s[i]);
    }
  }
}

// The code's value times 2^112 as bf16 bits (exact: an e4m3 value has 4 significant bits).
__device__ __forceinline__ uint16_t e4m3_biased_bf16(uint8_t code) {
  const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
  return uint16_t(__float_as_uint(v * kActivationBias) >> 16);
}

// 4 e4m3 codes (a little-endian word) as floats 2^-120 times their values: each code's sign, exponent
// and mantissa bits moved into a float's (bias 127 against 7); e4m3 subnormals become float
// subnormals, exact, as the FMA takes them (no flush to zero in this build). Code 0x7f (NaN) would
// read as 480: weights are quantized from finite values, so no weight holds it.
__device__ __forceinline__ void e4m3x4_to_f32_scaled(uint32_t u, float* f) {
  f[0] = __uint_as_float(((u << 20) & 0x07f00000u) | ((u << 24) & 0x80000000u));
  f[1] = __uint_as_float(((u << 12) & 0x07f00000u) | ((u << 16) & 0x80000000u));
  f[2] = __uint_as_float(((u << 4) & 0x07f00000u) | ((u << 8) & 0x80000000u));
  f[3] = __uint_as_float(((u >> 4) & 0x07f00000u) | (u & 0x80000000u));
}

// Constant indices only: a dynamically indexed kernel parameter would be copied to local memory.
__device__ __forceinline__ int fp8_scale_row(const Fp8Parts& p, int r) {
  int first_row = p.first_row[0], first_scale_row = p.first_scale_row[0];
#pragma unroll
  for (int q = 1; q < kFp8MaxParts; ++q)
    if (q < p.count && r >= p.first_row[q]) first_row = p.first_row[q], first_scale_row = p.first_scale_row[q];
  return first_scale_row + (r - first_row) / kFp8Block;
}

// acc[r] += (sum of the chunk's 16 code products, fp32) * s_w * s_a[r] for the kM token rows.
template <int kM>
__device__ __forceinline__ void fp8_chunk(float (&acc)[kM], const uint4& wv, const uint16_t* xs, const float* ss,
                                          float sw, int k_pad, int kb_pad, int c) {
  float w[16];
  e4m3x4_to_f32_scaled(wv.x, w);
  e4m3x4_to_f32_scaled(wv.y, w + 4);
  e4m3x4_to_f32_scaled(wv.z, w + 8);
  e4m3x4_to_f32_scaled(wv.w, w + 12);
  const int blk = c / (kFp8Block / kChunk);
#pragma unroll
  for (int r = 0; r < kM; ++r) {
    const uint4* xp = reinterpret_cast<const uint4*>(xs + r * k_pad + c * kChunk);
    const uint4 x0 = xp[0], x1 = xp[1];
    const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    float p = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 xv = unpack_bf16x2(xw[j]);
      p = fmaf(w[2 * j], xv.x, p);
      p = fmaf(w[2 * j + 1], xv.y, p);
    }
    acc[r] = fmaf(p, sw * ss[r * kb_pad + blk], acc[r]);
  }
}

// A CTA quantizes its kM token rows (token group blockIdx.y) into shared memory once (codes as bf16
// values, 2^112 times, [kM][k_pad]; scales [kM][k_pad / 128]), then its 8 warps take weight rows, a
// warp a row: groups of 8 rows blockIdx.x, blockIdx.x + gridDim.x, ... (at most a resident wave of
// CTAs, so the quantization is amortized over the rows of the 201,088-row unembedding). A lane takes
// 16-byte chunks lane, lane + 32, ... of its row (a chunk lies in one 128-column block), kBatch of
// them in flight. The first row's first chunks are requested before the PDL wait (weights are no
// kernel's output) and the rest of it pulled into L2 there; each next row is pulled into L2 while
// the current one is summed.
// One row: at most 51 registers, 5 CTAs (40 warps) an SM, so QKV's 5,120 rows are one wave on 132
// SMs (as bf16_gemv, gemv.cu).
template <int kM>
__global__ void __launch_bounds__(kThreads, kM == 1 ? 5 : 1) bf16_fp8w_gemv(Fp8GemvArgs a) {
  constexpr int kBatch = batch_for_rows(kM);
  extern __shared__ __align__(16) unsigned char smem[];
  const int kb_pad = a.k_pad / kFp8Block;
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  float* ss = reinterpret_cast<float*>(smem + size_t(kM) * size_t(a.k_pad) * sizeof(uint16_t));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = (a.k + kChunk - 1) / kChunk;
  const int lines = (a.k + 127) / 128;
  const int row_groups = (a.n + kWarps - 1) / kWarps;
  auto row_ptr = [&](int group, bool& ok) {
    const int row = group * kWarps + warp;
    ok = group < row_groups && row < a.n;
    return a.w + int64_t(ok ? row : 0) * a.k_pad;
  };
  bool row_ok = false;
  const uint8_t* wrow = row_ptr(blockIdx.x, row_ok);
  uint4 wv[kBatch];
#pragma unroll
  for (int b = 0; b < kBatch; ++b) {
    const int cb = lane + b * 32;
    wv[b] = row_ok && cb < chunks ? ldg_stream(wrow + int64_t(cb) * kChunk) : make_uint4(0, 0, 0, 0);
  }
  for (int l = kBatch * 32 * kChunk / 128 + lane; row_ok && l < lines; l += 32) prefetch_l2(wrow + int64_t(l) * 128);
  pdl_wait();
  pdl_launch_dependents();

  // The CTA's token rows m0 .. m0 + rows - 1 (rows of the group past m are left unwritten: only their
  // own sums, never stored, read them), task t = (row t / groups, group t % groups) to warp t % 8.
  const int m0 = blockIdx.y * kM;
  const int groups = fp8_blocks(a.k), rows = min(kM, a.m - m0), tasks = rows * groups;
  constexpr int kTasks = kM == 1 ? 2 : kQuantTasks;  // one row: within the 51 registers
  for (int t0 = warp; t0 < tasks; t0 += kWarps * kTasks) {
    int tok[kTasks], g[kTasks];
#pragma unroll
    for (int i = 0; i < kTasks; ++i) {
      const int t = t0 + i * kWarps;
      tok[i] = t < tasks ? m0 + t / groups : a.m;
      g[i] = t < tasks ? t % groups : 0;
    }
    uint8_t code[kTasks][4];
    float s[kTasks];
    fp8_quantize_groups<kTasks>(a.x, a.m, a.k, tok, g, code, s);
#pragma unroll
    for (int i = 0; i < kTasks; ++i) {
      if (tok[i] >= a.m) break;
      const int r = tok[i] - m0;
      const uint2 packed =
          make_uint2(uint32_t(e4m3_biased_bf16(code[i][0])) | uint32_t(e4m3_biased_bf16(code[i][1])) << 16,
                     uint32_t(e4m3_biased_bf16(code[i][2])) | uint32_t(e4m3_biased_bf16(code[i][3])) << 16);
      *reinterpret_cast<uint2*>(xs + r * a.k_pad + g[i] * kFp8Block + 4 * lane) = packed;
      if (lane == 0) ss[r * kb_pad + g[i]] = s[i];
    }
  }
  __syncthreads();

  for (int group = blockIdx.x; group < row_groups; group += gridDim.x) {
    const int row = group * kWarps + warp;
    if (group != int(blockIdx.x)) {
      wrow = row_ptr(group, row_ok);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int cb = lane + b * 32;
        wv[b] = row_ok && cb < chunks ? ldg_stream(wrow + int64_t(cb) * kChunk) : make_uint4(0, 0, 0, 0);
      }
    }
    {
      bool next_ok = false;
      const uint8_t* next_row = row_ptr(group + gridDim.x, next_ok);
      for (int l = lane; next_ok && l < lines; l += 32) prefetch_l2(next_row + int64_t(l) * 128);
    }
    float acc[kM];
#pragma unroll
    for (int r = 0; r < kM; ++r) acc[r] = 0.0f;
    const float* srow = a.w_scales + int64_t(fp8_scale_row(a.parts, row_ok ? row : 0)) * kb_pad;
    for (int c = lane; row_ok && c < chunks; c += kBatch * 32) {
      uint4 next[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int cb = c + (kBatch + b) * 32;
        next[b] = cb < chunks ? ldg_stream(wrow + int64_t(cb) * kChunk) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int cb = c + b * 32;
        if (cb < chunks)
          fp8_chunk<kM>(acc, wv[b], xs, ss, __ldg(srow + cb / (kFp8Block / kChunk)) * kProductUnbias, a.k_pad, kb_pad,
                        cb);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) wv[b] = next[b];
    }
#pragma unroll
    for (int r = 0; r < kM; ++r) acc[r] = warp_sum(acc[r]);
    if (lane != 0 || !row_ok) continue;
    const float bias = a.bias ? bf16_bits_to_float(a.bias[row]) : 0.0f;
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      const int tok = m0 + r;
      if (tok >= a.m) break;
      const float y = acc[r] + bias;
      if (a.out_f32)
        static_cast<float*>(a.out)[int64_t(tok) * a.n + row] = y;
      else
        reinterpret_cast<__nv_bfloat16*>(a.out)[int64_t(tok) * a.n + row] = __float2bfloat16_rn(y);
      if (a.greedy.keys) greedy_offer(a.greedy, tok, greedy_key(y, row));
    }
  }
}

constexpr int kMmaRows = 16;   // weight rows a tile (the MMA's m)
constexpr int kMmaTokens = 8;  // token rows a CTA (the MMA's n)
// Bytes between token rows of the activation codes in shared memory: k_pad + 64, so the two token
// rows a quarter-warp reads fall on disjoint banks.
__host__ __device__ constexpr int mma_token_stride(int k_pad) { return k_pad + 64; }

// Lane (g, c)'s A operand of 16-row tile `tile` at 128-column block b: 16 bytes of weight rows g and
// g + 8 at columns 16c .. 16c + 15 and 64 + 16c .. 64 + 16c + 15 (zeros for rows past n).
__device__ __forceinline__ void mma_tile_weights(const Fp8GemvArgs& a, int tile, int b, int g, int c, uint4 (&w)[4]) {
  const int r_lo = tile * kMmaRows + g, r_hi = r_lo + 8;
  const bool lo = r_lo < a.n, hi = r_hi < a.n;
  const uint8_t* p_lo = a.w + int64_t(lo ? r_lo : 0) * a.k_pad + b * kFp8Block + 16 * c;
  const uint8_t* p_hi = a.w + int64_t(hi ? r_hi : 0) * a.k_pad + b * kFp8Block + 16 * c;
  const uint4 z = make_uint4(0, 0, 0, 0);
  w[0] = lo ? ldg_stream(p_lo) : z;
  w[1] = lo ? ldg_stream(p_lo + 64) : z;
  w[2] = hi ? ldg_stream(p_hi) : z;
  w[3] = hi ? ldg_stream(p_hi + 64) : z;
}

// Blocks first, first + 8, ... (below `blocks`) of tile `tile` into L2: lanes c = 0 and 2 take rows g
// and g + 8, a block's row being one 128-byte line.
__device__ __forceinline__ void mma_prefetch_tile(const Fp8GemvArgs& a, int tile, int first, int blocks, int g, int c) {
  const int r = tile * kMmaRows + (c < 2 ? g : g + 8);
  if (r < a.n && (c % 2) == 0)
    for (int b = first; b < blocks; b += kWarps) prefetch_l2(a.w + int64_t(r) * a.k_pad + b * kFp8Block);
}

// Warp w's share of the CTA's token rows m0 .. m0 + rows - 1 into shared memory (codes [8][stride],
// scales [8][k_pad / 128]): tasks (token row t % rows, group w + 8 (t / rows)), exactly the groups its
// MMAs read, so it needs no CTA barrier before them. Rows past m are left unwritten (only the MMA
// columns of those tokens, never stored, read them). Pre-quantized activations (x_codes: the
// quantize kernel's output, for more than 8 rows) are copied instead.
__device__ __forceinline__ void mma_stage_tokens(const Fp8GemvArgs& a, int m0, int rows, int blocks, int warp, int lane,
                                                 uint8_t* xs, float* ss, int stride, int kb_pad) {
  const int tasks = warp < blocks ? rows * ((blocks - warp + kWarps - 1) / kWarps) : 0;
  if (a.x_codes) {
    // 8 tasks' loads in flight at once (one at a time, each waited for its load).
    constexpr int kCopies = 8;
    for (int t0 = 0; t0 < tasks; t0 += kCopies) {
      uint32_t code[kCopies];
      float scale[kCopies];
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int t = t0 + i, r = t % rows, gq = warp + kWarps * (t / rows);
        code[i] =
            t < tasks
                ? *reinterpret_cast<const uint32_t*>(a.x_codes + int64_t(m0 + r) * a.k_pad + gq * kFp8Block + 4 * lane)
                : 0u;
        scale[i] = t < tasks && lane == 0 ? a.x_scales[int64_t(m0 + r) * kb_pad + gq] : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int t = t0 + i, r = t % rows, gq = warp + kWarps * (t / rows);
        if (t >= tasks) break;
        *reinterpret_cast<uint32_t*>(xs + r * stride + gq * kFp8Block + 4 * lane) = code[i];
        if (lane == 0) ss[r * kb_pad + gq] = scale[i];
      }
    }
  } else {
    constexpr int kTasks = kQuantTasks;
    for (int t0 = 0; t0 < tasks; t0 += kTasks) {
      int tok[kTasks], g[kTasks];
#pragma unroll
      for (int i = 0; i < kTasks; ++i) {
        const int t = t0 + i;
        tok[i] = t < tasks ? m0 + t % rows : a.m;
        g[i] = t < tasks ? warp + kWarps * (t / rows) : 0;
      }
      uint8_t code[kTasks][4];
      float s[kTasks];
      fp8_quantize_groups<kTasks>(a.x, a.m, a.k, tok, g, code, s);
#pragma unroll
      for (int i = 0; i < kTasks; ++i) {
        if (t0 + i >= tasks) break;
        const int r = tok[i] - m0;
        *reinterpret_cast<uint32_t*>(xs + r * stride + g[i] * kFp8Block + 4 * lane) =
            uint32_t(code[i][0]) | uint32_t(code[i][1]) << 8 | uint32_t(code[i][2]) << 16 | uint32_t(code[i][3]) << 24;
        if (lane == 0) ss[r * kb_pad + g[i]] = s[i];
      }
    }
  }
  __syncwarp();
}

// Block b of a tile into lane (g, c)'s accumulators (rows g, g + 8 x token rows 2c, 2c + 1): the 4
// MMAs of the block on its weights w (mma_tile_weights) and the staged codes, words (0, 1), (2, 3) of
// each 16-byte load (a permutation of the block's columns that A and B share); then the block's sums
// (exact products, the tensor core's fp32 accumulation) times s_w * s_a, added in fp32.
__device__ __forceinline__ void mma_block_accumulate(float (&acc)[4], const uint4 (&w)[4], const uint8_t* xs,
                                                     const float* ss, int stride, int kb_pad, int b, int g, int c,
                                                     float w_lo, float w_hi) {
  const uint8_t* xp = xs + g * stride + b * kFp8Block + 16 * c;
  const uint4 x0 = *reinterpret_cast<const uint4*>(xp), x1 = *reinterpret_cast<const uint4*>(xp + 64);
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_e4m3_m16n8k32(d, {w[0].x, w[2].x, w[0].y, w[2].y}, {x0.x, x0.y});
  mma_e4m3_m16n8k32(d, {w[0].z, w[2].z, w[0].w, w[2].w}, {x0.z, x0.w});
  mma_e4m3_m16n8k32(d, {w[1].x, w[3].x, w[1].y, w[3].y}, {x1.x, x1.y});
  mma_e4m3_m16n8k32(d, {w[1].z, w[3].z, w[1].w, w[3].w}, {x1.z, x1.w});
  const float t0 = ss[(2 * c) * kb_pad + b], t1 = ss[(2 * c + 1) * kb_pad + b];
  acc[0] = fmaf(d[0], w_lo * t0, acc[0]);
  acc[1] = fmaf(d[1], w_lo * t1, acc[1]);
  acc[2] = fmaf(d[2], w_hi * t0, acc[2]);
  acc[3] = fmaf(d[3], w_hi * t1, acc[3]);
}

// One output's warp sums in warp order (red points at warp 0's, the next warps' follow every `stride`
// floats), plus its bias, in fp32: the value the linear rounds to its output dtype.
__device__ __forceinline__ float mma_output(const Fp8GemvArgs& a, const float* red, int stride, int row) {
  float sum = red[0];
  for (int w = 1; w < kWarps; ++w) sum += red[w * stride];
  return sum + (a.bias ? bf16_bits_to_float(a.bias[row]) : 0.0f);
}

// 2 to 8 token rows (and the groups of 8 of larger M): the weights as the MMA's A operand (16 rows,
// the wide side), the tokens as B (n = 8), e4m3 x e4m3 on tensor cores, so the code products cost
// nothing beside the bytes (the FMA kernel above spends ~20 instructions a weight byte at 8 rows).
// A CTA owns 16-row tiles (grid-stride, one resident wave) and its 8 warps split K by 128-column
// blocks (block b to warp b % 8); warp w quantizes exactly the activation groups it reads
// (mma_stage_tokens). Per block: lane (g, c) loads 16 bytes of weight rows g and g + 8 at columns
// 16c .. 16c + 15 and 64 + 16c .., and token row g's codes at the same columns; the 4 MMAs of the
// block and its scales: mma_block_accumulate. The warps' sums meet in shared memory in warp order.
// The first tile's first block is requested before the PDL wait and its other blocks pulled into L2;
// each next tile is pulled into L2 while one is summed.
// The device functions above are shared with bf16_fp8w_gemv_mma_qkv_rope (below), whose qkv values
// must be this kernel's bit for bit: change them there too.
// At most 85 registers: 3 CTAs an SM (QKV's 320 tiles in one wave on 132 SMs).
__global__ void __launch_bounds__(kThreads, 3) bf16_fp8w_gemv_mma(Fp8GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[kWarps][4][32];
  const int stride = mma_token_stride(a.k_pad), kb_pad = a.k_pad / kFp8Block;
  uint8_t* xs = smem;
  float* ss = reinterpret_cast<float*>(smem + size_t(kMmaTokens) * size_t(stride));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int blocks = fp8_blocks(a.k);
  const int tiles = (a.n + kMmaRows - 1) / kMmaRows;
  uint4 cur[4] = {};
  if (int(blockIdx.x) < tiles && warp < blocks) {
    mma_tile_weights(a, blockIdx.x, warp, g, c, cur);
    mma_prefetch_tile(a, blockIdx.x, warp + kWarps, blocks, g, c);
  }
  pdl_wait();
  pdl_launch_dependents();

  const int m0 = blockIdx.y * kMmaTokens;
  mma_stage_tokens(a, m0, min(kMmaTokens, a.m - m0), blocks, warp, lane, xs, ss, stride, kb_pad);

  // Warp 0's lane (g, c): the greedy keys of tokens m0 + 2c, + 1 over its rows (as bf16_gemv_mma).
  unsigned long long best[2] = {0ull, 0ull};
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int r_lo = tile * kMmaRows + g, r_hi = r_lo + 8;
    const float* s_lo = a.w_scales + int64_t(fp8_scale_row(a.parts, r_lo < a.n ? r_lo : 0)) * kb_pad;
    const float* s_hi = a.w_scales + int64_t(fp8_scale_row(a.parts, r_hi < a.n ? r_hi : 0)) * kb_pad;
    if (tile != int(blockIdx.x) && warp < blocks) mma_tile_weights(a, tile, warp, g, c, cur);
    mma_prefetch_tile(a, tile + int(gridDim.x), warp, blocks, g, c);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int b = warp; b < blocks; b += kWarps) {
      uint4 nxt[4] = {};
      if (b + kWarps < blocks) mma_tile_weights(a, tile, b + kWarps, g, c, nxt);
      mma_block_accumulate(acc, cur, xs, ss, stride, kb_pad, b, g, c, __ldg(s_lo + b), __ldg(s_hi + b));
#pragma unroll
      for (int i = 0; i < 4; ++i) cur[i] = nxt[i];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = m0 + 2 * c + (i & 1), row = i < 2 ? r_lo : r_hi;
        if (tok >= a.m || row >= a.n) continue;
        const float y = mma_output(a, &red[0][i][lane], 4 * 32, row);
        if (a.out_f32)
          static_cast<float*>(a.out)[int64_t(tok) * a.n + row] = y;
        else
          reinterpret_cast<__nv_bfloat16*>(a.out)[int64_t(tok) * a.n + row] = __float2bfloat16_rn(y);
        if (a.greedy.keys) {
          const unsigned long long key = greedy_key(y, row);
          if (key > best[i & 1]) best[i & 1] = key;
        }
      }
    }
    __syncthreads();  // red is reused by the next tile
  }
  if (warp == 0 && a.greedy.keys) greedy_offer_token_pairs(a.greedy, best, m0, a.m);
}

// One token's QKV projection with RoPE and the KV cache write in its epilogue (Fp8QkvRopeArgs). A
// rotation pairs rows i and i + 32 of a head, which lie in 16-row tiles j and j + 2 of the head's 4:
// a unit (head h, j = 0 or 1) is that pair of tiles, so one CTA finishes both rows of each pair it
// rotates, without an exchange between CTAs. The CTA is bf16_fp8w_gemv_mma's at one token row with
// the same device functions (staging, weight fragments, blocks split over the warps as b % 8, block
// sums and scale products, warp-order sums, bias): its pre-rotation values are that kernel's bit for
// bit. It runs the unit's two tiles together (both tiles' loads of a block in flight at once, half as
// many CTAs). Lane (g, c < 2) of warp 0 then takes pair i = 16 j + g + 8 c of the head: rounds rows i
// and i + 32 to bf16 as the linear's output is, rotates them (q and k heads) with the RoPE kernel's
// rope_rotate_f32 and cos / sin, and writes qkv and, unless the slot is < 0, the k / v cache as
// bf16_rope_kv_cache_write does. cos / sin are computed once a CTA by the last warp (the one with
// fewest blocks when 8 does not divide them: 23 at hidden 2,880).
// At most 128 registers, 2 CTAs an SM: gpt-oss's 160 units in one wave on 132 SMs.
constexpr int kTilesPerHead = kRopeHeadDim / kMmaRows;  // 4
constexpr int kPairTiles = kRopeHalf / kMmaRows;        // tile j + 2 holds the partners of tile j's rows
static_assert(kRopeHalf % kMmaRows == 0 && kRopeHalf == 32, "a unit's tile pair and one cos / sin per lane");

// Rows row0 and row0 + 32 of a head (a rotation pair; row0 % 64 < 32) from their fp32 sums: rounded to
// bf16 as the linear's output is, rotated (q and k heads) with the RoPE kernel's rope_rotate_f32, written
// to qkv and, unless the slot is < 0, to the k / v cache as bf16_rope_kv_cache_write does (bf16, or the
// e4m3 codes of an fp8 cache: a branch on the layer's element type here, once a thread after the GEMV,
// rather than a second instantiation of both large kernels). Shared by both fused kernels, so their
// epilogues cannot drift apart.
__device__ __forceinline__ void qkv_rope_write_pair(const RopeCacheWriteArgs& r, int row0, float sum0, float sum1,
                                                    const float* cos_s, const float* sin_s) {
  const int row1 = row0 + kRopeHalf;
  __nv_bfloat16 y0 = __float2bfloat16_rn(sum0), y1 = __float2bfloat16_rn(sum1);
  float f0 = __bfloat162float(y0), f1 = __bfloat162float(y1);  // v's values; k's are rotated below
  const int head = row0 / kRopeHeadDim, i = row0 % kRopeHeadDim;
  const int hq = r.num_q_heads, hkv = r.num_kv_heads;
  if (head < hq + hkv) {
    rope_rotate_f32(f0, f1, cos_s[i], sin_s[i], f0, f1);
    y0 = __float2bfloat16_rn(f0), y1 = __float2bfloat16_rn(f1);
  }
  r.qkv[row0] = y0;
  r.qkv[row1] = y1;
  const int slot = r.slots[0];
  if (slot >= 0 && head >= hq) {
    const bool is_k = head < hq + hkv;
    const int kv_head = is_k ? head - hq : head - hq - hkv;
    if (r.kv_elem == KvCacheElem::Fp8E4m3)
      kv_cache_store_pair<KvCacheElem::Fp8E4m3>(r, is_k, slot, kv_head, i, f0, f1, y0, y1);
    else
      kv_cache_store_pair<KvCacheElem::Bf16>(r, is_k, slot, kv_head, i, f0, f1, y0, y1);
  }
}

__global__ void __launch_bounds__(kThreads, 2) bf16_fp8w_gemv_mma_qkv_rope(Fp8QkvRopeArgs q) {
  const Fp8GemvArgs& a = q.linear;
  const RopeCacheWriteArgs& r = q.rope;
  extern __shared__ __align__(16) unsigned char smem[];
  // [warp][tile j's rows g, g + 8; tile j + 2's rows g, g + 8][lane]: token 0's accumulators 0 and 2.
  __shared__ float red[kWarps][4][32];
  __shared__ float cos_s[kRopeHalf], sin_s[kRopeHalf];
  const int stride = mma_token_stride(a.k_pad), kb_pad = a.k_pad / kFp8Block;
  uint8_t* xs = smem;
  float* ss = reinterpret_cast<float*>(smem + size_t(kMmaTokens) * size_t(stride));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int blocks = fp8_blocks(a.k);
  const int units = a.n / kRopeHalf;  // 2 a head
  auto first_tile = [](int u) { return u / 2 * kTilesPerHead + u % 2; };
  uint4 cur[2][4] = {};
  if (int(blockIdx.x) < units && warp < blocks) {
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int tile = first_tile(blockIdx.x) + t * kPairTiles;
      mma_tile_weights(a, tile, warp, g, c, cur[t]);
      mma_prefetch_tile(a, tile, warp + kWarps, blocks, g, c);
    }
  }
  pdl_wait();
  pdl_launch_dependents();

  mma_stage_tokens(a, 0, 1, blocks, warp, lane, xs, ss, stride, kb_pad);
  if (warp == kWarps - 1) rope_cos_sin(r, r.positions[0], lane, cos_s[lane], sin_s[lane]);

  for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int tile0 = first_tile(unit);
    int s_lo[2], s_hi[2];  // offsets of the rows' block scales in a.w_scales (32-bit: fewer registers)
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int r_lo = (tile0 + t * kPairTiles) * kMmaRows + g;
      s_lo[t] = fp8_scale_row(a.parts, r_lo) * kb_pad;
      s_hi[t] = fp8_scale_row(a.parts, r_lo + 8) * kb_pad;
      if (unit != int(blockIdx.x) && warp < blocks) mma_tile_weights(a, tile0 + t * kPairTiles, warp, g, c, cur[t]);
      if (unit + int(gridDim.x) < units)
        mma_prefetch_tile(a, first_tile(unit + int(gridDim.x)) + t * kPairTiles, warp, blocks, g, c);
    }
    float acc[2][4] = {};
    for (int b = warp; b < blocks; b += kWarps) {
      uint4 nxt[2][4] = {};
#pragma unroll
      for (int t = 0; t < 2; ++t)
        if (b + kWarps < blocks) mma_tile_weights(a, tile0 + t * kPairTiles, b + kWarps, g, c, nxt[t]);
#pragma unroll
      for (int t = 0; t < 2; ++t)
        mma_block_accumulate(acc[t], cur[t], xs, ss, stride, kb_pad, b, g, c, __ldg(a.w_scales + s_lo[t] + b),
                             __ldg(a.w_scales + s_hi[t] + b));
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) cur[t][i] = nxt[t][i];
    }
    // Accumulators 1 and 3 are token 1's (none here): never stored, so never computed.
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      red[warp][2 * t][lane] = acc[t][0];
      red[warp][2 * t + 1][lane] = acc[t][2];
    }
    __syncthreads();  // also publishes cos_s / sin_s (the first unit)
    if (warp == 0 && c < 2) {
      const int src = 4 * g;  // lane (g, 0), which holds token 0's accumulators of rows g and g + 8
      const int row0 = tile0 * kMmaRows + g + 8 * c, row1 = row0 + kRopeHalf;
      qkv_rope_write_pair(r, row0, mma_output(a, &red[0][c][src], 4 * 32, row0),
                          mma_output(a, &red[0][2 + c][src], 4 * 32, row1), cos_s, sin_s);
    }
    __syncthreads();  // red is reused by the next unit
  }
}

// ---------------------------------------------------------------- one token row, K split over CTAs
//
// At one token row the kernels above are far from the H200's 4.27 TB/s (997f033, ncu: O 2,880 x 4,096
// in 10.3 us = 1.15 TB/s, QKV 5,120 x 2,880 + RoPE in 11.8 us = 1.25 TB/s). Two reasons, both of
// work granularity rather than arithmetic:
//  - the work units are few and large: O has 180 tiles of 64 KB on 132 SMs (48 SMs stream 128 KB,
//    84 stream 64 KB; the mean is 89 KB), the fused QKV 160 units of 92 KB (28 SMs get two);
//  - each warp keeps one 128-column block (2 KB) in flight beside the one it sums, so a warp's 4 blocks
//    (O) are ~4 dependent memory round trips after the PDL wait.
// The kernels below keep every product and every sum of the kernels above, in the same order, and
// only move them: the 8 warps' K slices (block b to "virtual warp" b % 8) of a 16-row tile go to
// kSplitCtas CTAs of kSplitWarps warps (O: 360 CTAs of 32 KB, at most 3 an SM; QKV: 640 CTAs, one
// tile each, of 4 virtual warps, at most 5 an SM); a warp requests all its blocks of the tile (up to
// kDepth, 8 KB for O) before the PDL wait, with their weight scales; the activation row is staged
// (quantized) by each warp for exactly its own blocks as before. Each CTA writes its virtual warps'
// 16 row sums to a workspace; the last CTA of the tile (of the unit, for QKV) by a ticket sums the 8
// partials in virtual-warp order plus the bias (mma_output's order) and writes the output, then
// resets the ticket for the next launch. Outputs are the kernels above's bit for bit
// (CudaFp8.SplitGemvIsTheOneRowGemvBitForBit, CudaFp8.FusedQkvRopeKvWriteKernelIsTheGemvThenRopeBitForBit).
constexpr int kSplitWarps = 4;
constexpr int kSplitThreads = kSplitWarps * 32;
constexpr int kSplitCtas = kWarps / kSplitWarps;  // CTAs per 16-row tile
static_assert(kWarps % kSplitWarps == 0, "a CTA owns whole virtual warps");
static_assert(kFp8SplitPartialFloats == kFp8SplitMaxTiles * kWarps * kMmaRows, "the partials workspace");
// Blocks a warp holds in registers: all of O's (4096 / 128 / 8 = 4) and of QKV's (23 blocks: 3).
constexpr int kSplitDepthGemv = 4, kSplitDepthQkv = 3;

size_t split_smem_bytes(int k_pad) { return size_t(k_pad) + size_t(k_pad / kFp8Block) * sizeof(float); }

// mma_block_accumulate for token row 0 alone (codes [k_pad] and scales [k_pad / 128] in shared memory):
// lanes g > 0 feed zeros as the MMA's B columns 1..7 (tokens that do not exist), which no output of
// column 0 depends on, so acc0 / acc2 of lanes (g, 0) are mma_block_accumulate's acc[0] / acc[2] bit
// for bit; the other lanes' values are never stored.
__device__ __forceinline__ void mma_block_accumulate_row0(float& acc0, float& acc2, const uint4 (&w)[4],
                                                          const uint8_t* xs, const float* ss, int b, int g, int c,
                                                          float w_lo, float w_hi) {
  uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
  if (g == 0) {
    const uint8_t* xp = xs + b * kFp8Block + 16 * c;
    x0 = *reinterpret_cast<const uint4*>(xp);
    x1 = *reinterpret_cast<const uint4*>(xp + 64);
  }
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_e4m3_m16n8k32(d, {w[0].x, w[2].x, w[0].y, w[2].y}, {x0.x, x0.y});
  mma_e4m3_m16n8k32(d, {w[0].z, w[2].z, w[0].w, w[2].w}, {x0.z, x0.w});
  mma_e4m3_m16n8k32(d, {w[1].x, w[3].x, w[1].y, w[3].y}, {x1.x, x1.y});
  mma_e4m3_m16n8k32(d, {w[1].z, w[3].z, w[1].w, w[3].w}, {x1.z, x1.w});
  const float t0 = ss[b];
  acc0 = fmaf(d[0], w_lo * t0, acc0);
  acc2 = fmaf(d[2], w_hi * t0, acc2);
}

// Virtual warp vw's activation groups vw, vw + 8, ... (those its MMAs read) of the one token row,
// quantized into shared memory (codes [k_pad], scales [k_pad / 128]) by fp8_quantize_groups's rule and
// expression order (so mma_stage_tokens's codes and scales bit for bit), kTasks groups' loads in flight
// at once. The values stay packed bf16 (2 registers a group instead of 4) and are unpacked where used:
// the warp holds its weight blocks in registers meanwhile.
template <int kTasks>
__device__ __forceinline__ void split_stage_row(const Fp8GemvArgs& a, int vw, int blocks, int lane, uint8_t* xs,
                                                float* ss) {
  for (int j0 = 0; vw + kWarps * j0 < blocks; j0 += kTasks) {
    uint2 bits[kTasks];
    float amax[kTasks];
#pragma unroll
    for (int i = 0; i < kTasks; ++i) {
      const int col = (vw + kWarps * (j0 + i)) * kFp8Block + 4 * lane;
      const uint16_t* p = a.x + col;
      if (a.k % 4 == 0 && col < a.k) {
        bits[i] = *reinterpret_cast<const uint2*>(p);
      } else {  // load_group_lane's tail: element by element, zeros (bf16 +0) past k
        uint16_t e[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) e[j] = col + j < a.k ? p[j] : uint16_t(0);
        bits[i] = make_uint2(uint32_t(e[0]) | uint32_t(e[1]) << 16, uint32_t(e[2]) | uint32_t(e[3]) << 16);
      }
    }
#pragma unroll
    for (int i = 0; i < kTasks; ++i) {
      const float2 lo = unpack_bf16x2(bits[i].x), hi = unpack_bf16x2(bits[i].y);
      amax[i] = fmaxf(fmaxf(fabsf(lo.x), fabsf(lo.y)), fmaxf(fabsf(hi.x), fabsf(hi.y)));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int i = 0; i < kTasks; ++i) amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], o));
#pragma unroll
    for (int i = 0; i < kTasks; ++i) {
      const int gq = vw + kWarps * (j0 + i);
      if (gq >= blocks) break;
      const float2 lo = unpack_bf16x2(bits[i].x), hi = unpack_bf16x2(bits[i].y);
      const float v[4] = {lo.x, lo.y, hi.x, hi.y};
      const float scale = __fdiv_rn(amax[i], 448.0f);
      uint8_t code[4];
      fp8_codes_at(v, scale, code);
      *reinterpret_cast<uint32_t*>(xs + gq * kFp8Block + 4 * lane) =
          uint32_t(code[0]) | uint32_t(code[1]) << 8 | uint32_t(code[2]) << 16 | uint32_t(code[3]) << 24;
      if (lane == 0) ss[gq] = scale;
    }
  }
  __syncwarp();
}

// One warp's share of a tile: virtual warp vw's blocks vw, vw + 8, ... (below `blocks`) of `tile`.
// Slot i of the register ring holds the j-th of them for j % kDepth == i: weights (mma_tile_weights)
// and rows g / g + 8's block scales. s_lo / s_hi: those rows' scale rows.
template <int kDepth>
struct SplitWarp {
  uint4 w[kDepth][4] = {};
  float sl[kDepth] = {}, sh[kDepth] = {};
  int s_lo, s_hi;  // offsets of the rows' block scales in a.w_scales (32-bit: fewer registers)

  __device__ __forceinline__ SplitWarp(const Fp8GemvArgs& a, int tile, int g) {
    const int kb_pad = a.k_pad / kFp8Block, r_lo = tile * kMmaRows + g, r_hi = r_lo + 8;
    s_lo = fp8_scale_row(a.parts, r_lo < a.n ? r_lo : 0) * kb_pad;
    s_hi = fp8_scale_row(a.parts, r_hi < a.n ? r_hi : 0) * kb_pad;
  }
  __device__ __forceinline__ void load(const Fp8GemvArgs& a, int tile, int b, int g, int c, int i) {
    mma_tile_weights(a, tile, b, g, c, w[i]);
    sl[i] = __ldg(a.w_scales + s_lo + b);
    sh[i] = __ldg(a.w_scales + s_hi + b);
  }
  // Before the PDL wait (weights are no kernel's output): the first kDepth blocks into registers, the
  // rest of the warp's blocks into L2.
  __device__ __forceinline__ void request(const Fp8GemvArgs& a, int tile, int vw, int blocks, int g, int c) {
#pragma unroll
    for (int i = 0; i < kDepth; ++i)
      if (vw + kWarps * i < blocks) load(a, tile, vw + kWarps * i, g, c, i);
    mma_prefetch_tile(a, tile, vw + kWarps * kDepth, blocks, g, c);
  }
  // The blocks' sums in block order (the acc chain of the 8-warp kernels), each slot refilled with the
  // block kDepth further on as soon as it is summed.
  __device__ __forceinline__ void accumulate(const Fp8GemvArgs& a, int tile, int vw, int blocks, int g, int c,
                                             const uint8_t* xs, const float* ss, float& acc0, float& acc2) {
    for (int j0 = 0; vw + kWarps * j0 < blocks; j0 += kDepth) {
#pragma unroll
      for (int i = 0; i < kDepth; ++i) {
        const int b = vw + kWarps * (j0 + i);
        if (b >= blocks) break;
        mma_block_accumulate_row0(acc0, acc2, w[i], xs, ss, b, g, c, sl[i], sh[i]);
        if (b + kWarps * kDepth < blocks) load(a, tile, b + kWarps * kDepth, g, c, i);
      }
    }
  }
};

// Lanes (g, 0) hold rows g and g + 8's sums: virtual warp vw's partials of `tile`, [tile][vw][16 rows].
__device__ __forceinline__ void split_store_partials(const Fp8GemvArgs& a, int tile, int vw, int g, int c, float acc0,
                                                     float acc2) {
  float* part = a.split_partials + (int64_t(tile) * kWarps + vw) * kMmaRows;
  if (c == 0) {
    part[g] = acc0;
    part[g + 8] = acc2;
  }
}

// Whether this CTA is the last of `ctas` to arrive at *ticket (the fused router's last-block pattern):
// every CTA's partials are visible device-wide before its ticket, and the last reads them after a
// second fence, with __ldcg (L2, never a stale L1 line). The last resets the ticket to 0 at once (no
// other CTA of the launch touches it again), ready for the next launch and for CUDA graph replays.
// Only after pdl_wait(): the previous launch, which used the same tickets, has completed.
__device__ __forceinline__ bool split_last_cta(int32_t* ticket, int ctas) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(ticket, 1) == ctas - 1;
    if (last) *ticket = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// Row `row_in_tile`'s 8 partials summed in virtual-warp order plus the bias: mma_output's value.
__device__ __forceinline__ float split_output(const Fp8GemvArgs& a, int tile, int row_in_tile, float bias) {
  const float* part = a.split_partials + int64_t(tile) * (kWarps * kMmaRows) + row_in_tile;
  float sum = __ldcg(part);
  for (int w = 1; w < kWarps; ++w) sum += __ldcg(part + w * kMmaRows);
  return sum + bias;
}

// bf16_fp8w_gemv_mma at one token row: CTA blockIdx.x = (tile, K half), tile = blockIdx.x / kSplitCtas.
// At most 128 registers: 4 CTAs (16 warps) an SM, so O's 360 CTAs are one wave on 132 SMs.
__global__ void __launch_bounds__(kSplitThreads, 4) bf16_fp8w_gemv_mma_split(Fp8GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint8_t* xs = smem;
  float* ss = reinterpret_cast<float*>(smem + a.k_pad);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int tile = int(blockIdx.x) / kSplitCtas, vw = int(blockIdx.x) % kSplitCtas * kSplitWarps + warp;
  const int blocks = fp8_blocks(a.k);
  SplitWarp<kSplitDepthGemv> sw(a, tile, g);
  sw.request(a, tile, vw, blocks, g, c);
  // Thread t < 16 writes row t of the tile if this CTA finishes it; the bias is a weight, read now.
  const int row = tile * kMmaRows + int(threadIdx.x);
  const float bias = a.bias && threadIdx.x < kMmaRows && row < a.n ? bf16_bits_to_float(a.bias[row]) : 0.0f;
  pdl_wait();
  pdl_launch_dependents();

  split_stage_row<kSplitDepthGemv>(a, vw, blocks, lane, xs, ss);
  float acc0 = 0.0f, acc2 = 0.0f;
  sw.accumulate(a, tile, vw, blocks, g, c, xs, ss, acc0, acc2);
  split_store_partials(a, tile, vw, g, c, acc0, acc2);
  if (!split_last_cta(a.split_tickets + tile, kSplitCtas)) return;
  if (threadIdx.x < kMmaRows && row < a.n) {
    const float y = split_output(a, tile, int(threadIdx.x), bias);
    if (a.out_f32)
      static_cast<float*>(a.out)[row] = y;
    else
      reinterpret_cast<__nv_bfloat16*>(a.out)[row] = __float2bfloat16_rn(y);
    if (a.greedy.keys) greedy_offer(a.greedy, 0, greedy_key(y, row));
  }
}

// bf16_fp8w_gemv_mma_qkv_rope with the split: a unit (head, j) = tiles j and j + 2 of the head is
// 2 x kSplitCtas CTAs (tile, K half), blockIdx.x = unit * 4 + tile of the pair * kSplitCtas + half.
// The unit's last CTA (its ticket) finishes the 16 rotation pairs: thread t < 16 takes pair i = t,
// rows tile0 * 16 + t and + 32. cos / sin are computed by every CTA's last warp (only the last CTA's
// are used; the unit's last CTA is known only at its ticket, and sincos there would be on the
// critical path).
// At most 102 registers: 5 CTAs an SM, so gpt-oss's 640 CTAs are one wave on 132 SMs.
__global__ void __launch_bounds__(kSplitThreads, 5) bf16_fp8w_gemv_mma_qkv_rope_split(Fp8QkvRopeArgs q) {
  const Fp8GemvArgs& a = q.linear;
  const RopeCacheWriteArgs& r = q.rope;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float cos_s[kRopeHalf], sin_s[kRopeHalf];
  constexpr int kCtasPerUnit = 2 * kSplitCtas;
  uint8_t* xs = smem;
  float* ss = reinterpret_cast<float*>(smem + a.k_pad);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int unit = int(blockIdx.x) / kCtasPerUnit, part = int(blockIdx.x) % kCtasPerUnit;
  const int tile0 = unit / 2 * kTilesPerHead + unit % 2, tile = tile0 + part / kSplitCtas * kPairTiles;
  const int vw = part % kSplitCtas * kSplitWarps + warp;
  const int blocks = fp8_blocks(a.k);
  SplitWarp<kSplitDepthQkv> sw(a, tile, g);
  sw.request(a, tile, vw, blocks, g, c);
  const int row0 = tile0 * kMmaRows + int(threadIdx.x), row1 = row0 + kRopeHalf;
  float bias0 = 0.0f, bias1 = 0.0f;
  if (a.bias && threadIdx.x < kMmaRows)
    bias0 = bf16_bits_to_float(a.bias[row0]), bias1 = bf16_bits_to_float(a.bias[row1]);
  pdl_wait();
  pdl_launch_dependents();

  split_stage_row<kSplitDepthQkv>(a, vw, blocks, lane, xs, ss);
  if (warp == kSplitWarps - 1) rope_cos_sin(r, r.positions[0], lane, cos_s[lane], sin_s[lane]);
  float acc0 = 0.0f, acc2 = 0.0f;
  sw.accumulate(a, tile, vw, blocks, g, c, xs, ss, acc0, acc2);
  split_store_partials(a, tile, vw, g, c, acc0, acc2);
  if (!split_last_cta(a.split_tickets + unit, kCtasPerUnit)) return;  // its barriers publish cos_s / sin_s
  if (threadIdx.x < kMmaRows)
    qkv_rope_write_pair(r, row0, split_output(a, tile0, int(threadIdx.x), bias0),
                        split_output(a, tile0 + kPairTiles, int(threadIdx.x), bias1), cos_s, sin_s);
}

size_t mma_smem_bytes(int k_pad) {
  return size_t(kMmaTokens) * size_t(mma_token_stride(k_pad)) + size_t(kMmaTokens) * size_t(k_pad / kFp8Block) * 4;
}

size_t gemv_smem_bytes(int rows, int k_pad) {
  return size_t(rows) * size_t(k_pad) * sizeof(uint16_t) + size_t(rows) * size_t(k_pad / kFp8Block) * sizeof(float);
}

int gemv_group_rows(int m) { return m == 1 ? 1 : m == 2 ? 2 : m <= 4 ? 4 : 8; }

__global__ void __launch_bounds__(kThreads) bf16_add_bias_rows(Fp8BiasArgs a) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= int64_t(a.m) * a.n) return;
  auto* out = reinterpret_cast<__nv_bfloat16*>(a.out);
  out[i] = __float2bfloat16_rn(__bfloat162float(out[i]) + bf16_bits_to_float(a.bias[i % a.n]));
}

// At most one resident wave of CTAs (the kernel loops over row groups), never more than the groups.
__global__ void __launch_bounds__(1024) fp8_transpose_rows(Fp8TransposeArgs a) {
  __shared__ float tile[32][33];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  // Read src down its columns (rows contiguous), write dst along its rows (columns contiguous).
  const int r = r0 + int(threadIdx.x), c = c0 + int(threadIdx.y);
  if (r < a.rows && c < a.cols) {
    const int64_t at = int64_t(c) * a.rows + r;
    tile[threadIdx.y][threadIdx.x] =
        a.f32 ? static_cast<const float*>(a.src)[at] : bf16_bits_to_float(static_cast<const uint16_t*>(a.src)[at]);
  }
  __syncthreads();
  const int wr = r0 + int(threadIdx.y), wc = c0 + int(threadIdx.x);
  if (wr >= a.rows || wc >= a.cols) return;
  const float y = tile[threadIdx.x][threadIdx.y] + (a.bias ? bf16_bits_to_float(a.bias[wc]) : 0.0f);
  const int64_t at = int64_t(wr) * a.cols + wc;
  if (a.f32)
    static_cast<float*>(a.dst)[at] = y;
  else
    static_cast<__nv_bfloat16*>(a.dst)[at] = __float2bfloat16_rn(y);
}

template <typename Kernel, typename Args>
void launch_with_smem(Kernel kernel, dim3 grid, size_t smem, int sms, cudaStream_t stream, const Args& a) {
  int per_sm = 0;
  OSSRT_CUDA_CALL(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  grid.x = std::min(grid.x, unsigned(std::max(1, per_sm) * std::max(1, sms)));
  OSSRT_CUDA_CALL(launch_pdl_smem(kernel, grid, dim3(kThreads), smem, stream, a));
}

// The split kernels: one CTA per work unit, every unit launched (no cap at a resident wave: a CTA
// never waits for another, the last of a tile's does its sum), PDL as the others.
template <typename Kernel, typename Args>
void launch_split(Kernel kernel, unsigned ctas, size_t smem, cudaStream_t stream, const Args& a) {
  OSSRT_CUDA_CALL(launch_pdl_smem(kernel, dim3(ctas), dim3(kSplitThreads), smem, stream, a));
}

// Whether a one-row tensor-core GEMV of these arguments takes the split kernel (its workspace given,
// the tiles within it); the unembedding's 12,568 tiles do not: the persistent kernel's grid-stride
// loop already balances them.
bool split_takes(const Fp8GemvArgs& a) {
  return a.m == 1 && !a.x_codes && a.split_partials && a.split_tickets &&
         (a.n + kMmaRows - 1) / kMmaRows <= kFp8SplitMaxTiles;
}

}  // namespace

void launch_bf16_fp8_quantize_rows(const Fp8QuantizeArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(a.m >= 0 && a.k >= 1 && a.k_pad >= a.k && a.k_pad % kFp8KAlign == 0, "fp8 quantize: m ", a.m, " k ",
                 a.k, " k_pad ", a.k_pad);
  OSSRT_CU_CHECK(!a.token_major || a.chunk_rows >= 1, "fp8 quantize: chunk_rows ", a.chunk_rows);
  if (a.m == 0) return;
  bf16_fp8_quantize_rows<<<a.m, kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_fp8_quantize_rows");
}

// Raises (never lowers) a kernel's dynamic shared-memory limit: the limit is per kernel, not per
// weight, so a later, narrower weight must not take back what a wider one needs (an O projection of
// k_pad 4,096 after a QKV of 3,072 would otherwise fail to launch with invalid argument).
template <typename Kernel>
void raise_smem_limit(Kernel kernel, size_t bytes) {
  cudaFuncAttributes attr{};
  OSSRT_CUDA_CALL(cudaFuncGetAttributes(&attr, kernel));
  if (size_t(attr.maxDynamicSharedSizeBytes) >= bytes) return;
  OSSRT_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

void fp8_gemv_prepare(int k_pad) {
  const size_t smem = gemv_smem_bytes(kFp8GemvMaxRows, k_pad);
  OSSRT_CU_CHECK(smem <= kMaxSmemBytes, "bf16_fp8w_gemv: k_pad ", k_pad, " needs ", smem, " bytes of shared memory");
  raise_smem_limit(bf16_fp8w_gemv<1>, smem);
  raise_smem_limit(bf16_fp8w_gemv<2>, smem);
  raise_smem_limit(bf16_fp8w_gemv<4>, smem);
  raise_smem_limit(bf16_fp8w_gemv<8>, smem);
  raise_smem_limit(bf16_fp8w_gemv_mma, mma_smem_bytes(k_pad));
  raise_smem_limit(bf16_fp8w_gemv_mma_qkv_rope, mma_smem_bytes(k_pad));
  raise_smem_limit(bf16_fp8w_gemv_mma_split, split_smem_bytes(k_pad));
  raise_smem_limit(bf16_fp8w_gemv_mma_qkv_rope_split, split_smem_bytes(k_pad));
}

void launch_fp8_transpose_rows(const Fp8TransposeArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return;
  OSSRT_CU_CHECK((a.rows + 31) / 32 <= 65535, "fp8_transpose_rows: ", a.rows, " rows");
  fp8_transpose_rows<<<dim3(unsigned((a.cols + 31) / 32), unsigned((a.rows + 31) / 32)), dim3(32, 32), 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("fp8_transpose_rows");
}

void launch_bf16_add_bias_rows(const Fp8BiasArgs& a, cudaStream_t stream) {
  const int64_t n = int64_t(a.m) * a.n;
  if (n == 0) return;
  bf16_add_bias_rows<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_add_bias_rows");
}

bool fp8_gemv_supported(const Fp8GemvArgs& a) {
  return mma_smem_bytes(a.k_pad) <= kMaxSmemBytes && a.m >= 1 && a.n >= 1 && a.k >= 1 && a.k_pad >= a.k &&
         a.k_pad % kFp8KAlign == 0 && a.parts.count >= 1 && a.parts.count <= kFp8MaxParts &&
         reinterpret_cast<uintptr_t>(a.w) % 16 == 0 && reinterpret_cast<uintptr_t>(a.x) % 8 == 0 &&
         gemv_smem_bytes(gemv_group_rows(a.m), a.k_pad) <= kMaxSmemBytes;
}

void launch_bf16_fp8w_gemv(const Fp8GemvArgs& a, int sms, int mma_from_rows, cudaStream_t stream) {
  OSSRT_CU_CHECK(fp8_gemv_supported(a), "bf16_fp8w_gemv: m ", a.m, " n ", a.n, " k ", a.k, " k_pad ", a.k_pad,
                 " parts ", a.parts.count, " (k_pad a multiple of ", kFp8KAlign, ", 16-byte aligned weights)");
  OSSRT_CU_CHECK(!a.x_codes || a.x_scales, "bf16_fp8w_gemv: x_codes without x_scales");
  OSSRT_CU_CHECK(!a.greedy.keys || (a.out_f32 && a.greedy.rows == a.m && a.m <= kGreedyMaxRows),
                 "bf16_fp8w_gemv: the fused greedy argmax needs f32 outputs and the GEMV's token rows (", a.greedy.rows,
                 " for ", a.m, ", at most ", kGreedyMaxRows, ")");
  if (a.m >= mma_from_rows || a.m > kFp8GemvMaxRows || a.x_codes) {
    if (split_takes(a)) {
      const unsigned tiles = unsigned((a.n + kMmaRows - 1) / kMmaRows);
      launch_split(bf16_fp8w_gemv_mma_split, tiles * kSplitCtas, split_smem_bytes(a.k_pad), stream, a);
      return;
    }
    const dim3 grid((a.n + kMmaRows - 1) / kMmaRows, (a.m + kMmaTokens - 1) / kMmaTokens);
    OSSRT_CU_CHECK(grid.y <= 65535u, "bf16_fp8w_gemv_mma: ", a.m, " token rows");
    launch_with_smem(bf16_fp8w_gemv_mma, grid, mma_smem_bytes(a.k_pad), sms, stream, a);
    return;
  }
  const int rows = gemv_group_rows(a.m);
  const dim3 grid((a.n + kWarps - 1) / kWarps, (a.m + rows - 1) / rows);
  OSSRT_CU_CHECK(grid.y <= 65535u, "bf16_fp8w_gemv: ", a.m, " token rows");
  const size_t smem = gemv_smem_bytes(rows, a.k_pad);
  switch (rows) {
    case 1: launch_with_smem(bf16_fp8w_gemv<1>, grid, smem, sms, stream, a); break;
    case 2: launch_with_smem(bf16_fp8w_gemv<2>, grid, smem, sms, stream, a); break;
    case 4: launch_with_smem(bf16_fp8w_gemv<4>, grid, smem, sms, stream, a); break;
    default: launch_with_smem(bf16_fp8w_gemv<8>, grid, smem, sms, stream, a); break;
  }
}

bool fp8_qkv_rope_supported(const Fp8QkvRopeArgs& q) {
  const Fp8GemvArgs& a = q.linear;
  const RopeCacheWriteArgs& r = q.rope;
  return fp8_gemv_supported(a) && a.m == 1 && r.num_tokens == 1 && !a.out_f32 && a.out == r.qkv && !a.x_codes &&
         r.num_q_heads > 0 && r.num_kv_heads > 0 && r.block_size > 0 &&
         a.n == (r.num_q_heads + 2 * r.num_kv_heads) * kRopeHeadDim;
}

void launch_bf16_fp8w_gemv_qkv_rope_kv_write(const Fp8QkvRopeArgs& q, int sms, cudaStream_t stream) {
  OSSRT_CU_CHECK(fp8_qkv_rope_supported(q), "bf16_fp8w_gemv_mma_qkv_rope: m ", q.linear.m, " n ", q.linear.n, " k ",
                 q.linear.k, " for ", q.rope.num_q_heads, " q + ", q.rope.num_kv_heads,
                 " kv heads (one token, bf16 out into rope.qkv, (Hq + 2 Hkv) x 64 rows)");
  const unsigned units = unsigned(q.linear.n / kRopeHalf);
  if (split_takes(q.linear)) {
    launch_split(bf16_fp8w_gemv_mma_qkv_rope_split, units * 2 * kSplitCtas, split_smem_bytes(q.linear.k_pad), stream,
                 q);
    return;
  }
  launch_with_smem(bf16_fp8w_gemv_mma_qkv_rope, dim3(units), mma_smem_bytes(q.linear.k_pad), sms, stream, q);
}

}  // namespace ossrt::cuda
