// The FP8 block-scaled linears of fp8_linear.cuh: the activation quantizer and the small-M GEMV.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/fp8_linear.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBatch = 4;   // 16-byte weight chunks in flight per lane
constexpr int kChunk = 16;  // columns (bytes) a lane loads at once; 8 chunks a 128-column block
constexpr size_t kMaxSmemBytes = size_t(200) << 10;
// Exact powers of two that keep every product of the GEMV in float32's normal range: weights are
// decoded to 2^-120 times their e4m3 value (a bit move, below), activations stored as 2^112 times
// theirs, so a product is 2^-8 times the true one; the block sum is scaled back by 2^8.
constexpr float kActivationBias = 0x1p112f;
constexpr float kProductUnbias = 0x1p8f;

// One 128-channel group of one row, by one warp: lane l holds channels 4l .. 4l + 3 of the group in
// v (zeros past the row's end). The rule of core/fp8.h exactly: scale = max|v| / 448 (fmaxf ignores a
// NaN as std::max does there), code = e4m3(v / scale) rounded to nearest even and saturating to
// +-448 (__NV_SATFINITE; NaN stays NaN), a zero group scale 0 and codes 0. Returns the scale.
__device__ __forceinline__ float fp8_quantize_group(const float (&v)[4], uint8_t (&code)[4]) {
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  amax = warp_max(amax);
  const float scale = __fdiv_rn(amax, 448.0f);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    code[j] =
        scale == 0.0f ? uint8_t(0) : uint8_t(__nv_cvt_float_to_fp8(__fdiv_rn(v[j], scale), __NV_SATFINITE, __NV_E4M3));
  return scale;
}

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

__global__ void __launch_bounds__(kThreads) bf16_fp8_quantize_rows(Fp8QuantizeArgs a) {
  const int tok = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kb_pad = a.k_pad / kFp8Block;
  for (int g = warp; g < kb_pad; g += kWarps) {
    float v[4];
    load_group_lane(a.x, a.m, a.k, tok, g, v);
    uint8_t code[4];
    const float s = fp8_quantize_group(v, code);
    const uint32_t word =
        uint32_t(code[0]) | uint32_t(code[1]) << 8 | uint32_t(code[2]) << 16 | uint32_t(code[3]) << 24;
    *reinterpret_cast<uint32_t*>(a.codes + int64_t(tok) * a.k_pad + g * kFp8Block + 4 * lane) = word;
    if (lane == 0) {
      if (a.token_major)
        a.scales[int64_t(g) * a.scale_ld + tok] = s;
      else
        a.scales[int64_t(tok) * kb_pad + g] = s;
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

// A CTA: 8 weight rows (a warp each) against kM token rows (token group blockIdx.y), which it
// quantizes into shared memory first: codes as bf16 values (2^112 times; [kM][k_pad]) and scales
// [kM][k_pad / 128]. Each lane takes 16-byte chunks lane, lane + 32, ... of its row (a chunk lies
// in one 128-column block), kBatch of them in flight; the first ones are requested before the PDL
// wait (weights are no kernel's output), the rest of the row is pulled into L2 there.
// One row: at most 64 registers, 4 CTAs (32 warps) an SM.
template <int kM>
__global__ void __launch_bounds__(kThreads, kM == 1 ? 4 : 1) bf16_fp8w_gemv(Fp8GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int kb_pad = a.k_pad / kFp8Block;
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  float* ss = reinterpret_cast<float*>(smem + size_t(kM) * size_t(a.k_pad) * sizeof(uint16_t));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + warp;
  const bool row_ok = row < a.n;
  const uint8_t* wrow = a.w + int64_t(row_ok ? row : 0) * a.k_pad;
  const int chunks = (a.k + kChunk - 1) / kChunk;
  uint4 wv[kBatch];
#pragma unroll
  for (int b = 0; b < kBatch; ++b) {
    const int cb = lane + b * 32;
    wv[b] = row_ok && cb < chunks ? ldg_stream(wrow + int64_t(cb) * kChunk) : make_uint4(0, 0, 0, 0);
  }
  const int lines = (a.k + 127) / 128;
  for (int l = kBatch * 32 * kChunk / 128 + lane; row_ok && l < lines; l += 32) prefetch_l2(wrow + int64_t(l) * 128);
  pdl_wait();
  pdl_launch_dependents();

  const int m0 = blockIdx.y * kM;
  const int groups = fp8_blocks(a.k);
  for (int t = warp; t < kM * groups; t += kWarps) {
    const int r = t / groups, g = t % groups;
    float v[4];
    load_group_lane(a.x, a.m, a.k, m0 + r, g, v);
    uint8_t code[4];
    const float s = fp8_quantize_group(v, code);
    const uint2 packed = make_uint2(uint32_t(e4m3_biased_bf16(code[0])) | uint32_t(e4m3_biased_bf16(code[1])) << 16,
                                    uint32_t(e4m3_biased_bf16(code[2])) | uint32_t(e4m3_biased_bf16(code[3])) << 16);
    *reinterpret_cast<uint2*>(xs + r * a.k_pad + g * kFp8Block + 4 * lane) = packed;
    if (lane == 0) ss[r * kb_pad + g] = s;
  }
  __syncthreads();

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
  if (lane != 0 || !row_ok) return;
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
  }
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

template <typename Kernel>
void launch_with_smem(Kernel kernel, dim3 grid, size_t smem, cudaStream_t stream, const Fp8GemvArgs& a) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  OSSRT_CUDA_CALL(cudaLaunchKernelEx(&config, kernel, a));
}

}  // namespace

void launch_bf16_fp8_quantize_rows(const Fp8QuantizeArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(a.m >= 0 && a.k >= 1 && a.k_pad >= a.k && a.k_pad % kFp8KAlign == 0, "fp8 quantize: m ", a.m, " k ",
                 a.k, " k_pad ", a.k_pad);
  OSSRT_CU_CHECK(!a.token_major || a.scale_ld >= a.m, "fp8 quantize: scale_ld ", a.scale_ld, " < m ", a.m);
  if (a.m == 0) return;
  bf16_fp8_quantize_rows<<<a.m, kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_fp8_quantize_rows");
}

void fp8_gemv_prepare(int k_pad) {
  const int smem = int(gemv_smem_bytes(kFp8GemvMaxRows, k_pad));
  OSSRT_CU_CHECK(size_t(smem) <= kMaxSmemBytes, "bf16_fp8w_gemv: k_pad ", k_pad, " needs ", smem,
                 " bytes of shared memory");
  OSSRT_CUDA_CALL(cudaFuncSetAttribute(bf16_fp8w_gemv<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  OSSRT_CUDA_CALL(cudaFuncSetAttribute(bf16_fp8w_gemv<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  OSSRT_CUDA_CALL(cudaFuncSetAttribute(bf16_fp8w_gemv<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  OSSRT_CUDA_CALL(cudaFuncSetAttribute(bf16_fp8w_gemv<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

void launch_bf16_add_bias_rows(const Fp8BiasArgs& a, cudaStream_t stream) {
  const int64_t n = int64_t(a.m) * a.n;
  if (n == 0) return;
  bf16_add_bias_rows<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_add_bias_rows");
}

bool fp8_gemv_supported(const Fp8GemvArgs& a) {
  return a.m >= 1 && a.n >= 1 && a.k >= 1 && a.k_pad >= a.k && a.k_pad % kFp8KAlign == 0 && a.parts.count >= 1 &&
         a.parts.count <= kFp8MaxParts && reinterpret_cast<uintptr_t>(a.w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.x) % 8 == 0 && gemv_smem_bytes(gemv_group_rows(a.m), a.k_pad) <= kMaxSmemBytes;
}

void launch_bf16_fp8w_gemv(const Fp8GemvArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(fp8_gemv_supported(a), "bf16_fp8w_gemv: m ", a.m, " n ", a.n, " k ", a.k, " k_pad ", a.k_pad,
                 " parts ", a.parts.count, " (k_pad a multiple of ", kFp8KAlign, ", 16-byte aligned weights)");
  const int rows = gemv_group_rows(a.m);
  const dim3 grid((a.n + kWarps - 1) / kWarps, (a.m + rows - 1) / rows);
  OSSRT_CU_CHECK(grid.y <= 65535u, "bf16_fp8w_gemv: ", a.m, " token rows");
  const size_t smem = gemv_smem_bytes(rows, a.k_pad);
  switch (rows) {
    case 1: launch_with_smem(bf16_fp8w_gemv<1>, grid, smem, stream, a); break;
    case 2: launch_with_smem(bf16_fp8w_gemv<2>, grid, smem, stream, a); break;
    case 4: launch_with_smem(bf16_fp8w_gemv<4>, grid, smem, stream, a); break;
    default: launch_with_smem(bf16_fp8w_gemv<8>, grid, smem, stream, a); break;
  }
}

}  // namespace ossrt::cuda
