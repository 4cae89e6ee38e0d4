#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/gemv_common.cuh"
#include "backend/cuda/kernels/norm_row.cuh"
#include "backend/cuda/kernels/rope_cache.cuh"
#include "backend/cuda/kernels/rope_common.cuh"

namespace ossrt::cuda {
namespace {

// 768 threads: the (64 + 8) x 32 rotation pairs of a gpt-oss token are 3 per thread, so a decode
// token costs one round of loads rather than nine (the kernel is latency-bound at one token).
constexpr int kThreads = 768;

// One block per token. The 32 (cos, sin) pairs of the token are computed once into shared memory
// (double sincos on 32 threads per token is negligible next to the memory traffic),
// then each thread owns whole (head, i) rotation pairs, so the rotated k it writes to the cache is
// the value it just computed: no barrier between rotation and cache write. kElem: the cache's
// element type (an fp8 cache stores the codes of the fp32 rotation and of v, rope_cache.cuh).
template <KvCacheElem kElem>
__global__ void __launch_bounds__(kThreads) bf16_rope_kv_cache_write(RopeCacheWriteArgs a) {
  constexpr bool kFp8 = kElem == KvCacheElem::Fp8E4m3;
  pdl_wait();  // launched with PDL: qkv comes from the kernel before
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int hq = a.num_q_heads, hkv = a.num_kv_heads;
  const int row_elems = (hq + 2 * hkv) * kRopeHeadDim;
  __nv_bfloat16* row = a.qkv + int64_t(t) * row_elems;
  const int slot = a.slots[t];
  const int64_t block = slot >= 0 ? slot / a.block_size : 0;
  const int offset = slot >= 0 ? slot % a.block_size : 0;
  auto cache_index = [&](int g, int d) {
    return ((block * hkv + g) * a.block_size + offset) * int64_t(kRopeHeadDim) + d;
  };

  __shared__ float cos_s[kRopeHalf], sin_s[kRopeHalf];
  if (threadIdx.x < kRopeHalf) rope_cos_sin(a, a.positions[t], threadIdx.x, cos_s[threadIdx.x], sin_s[threadIdx.x]);
  __syncthreads();

  // q and k heads are contiguous: q heads 0..hq-1 then k heads hq..hq+hkv-1.
  const int rotated_pairs = (hq + hkv) * kRopeHalf;
  for (int p = threadIdx.x; p < rotated_pairs; p += kThreads) {
    const int head = p / kRopeHalf, i = p % kRopeHalf;
    const float c = cos_s[i], s = sin_s[i];
    __nv_bfloat16* x = row + head * kRopeHeadDim;
    float f1, f2;
    rope_rotate_f32(__bfloat162float(x[i]), __bfloat162float(x[i + kRopeHalf]), c, s, f1, f2);
    const __nv_bfloat16 o1 = __float2bfloat16_rn(f1), o2 = __float2bfloat16_rn(f2);
    x[i] = o1;
    x[i + kRopeHalf] = o2;
    if (head >= hq && slot >= 0) {
      const int g = head - hq;
      if constexpr (kFp8) {
        uint8_t* k_cache = static_cast<uint8_t*>(a.k_cache);
        const float scale = a.k_scale[g];
        k_cache[cache_index(g, i)] = kv_e4m3_code(f1, scale);
        k_cache[cache_index(g, i + kRopeHalf)] = kv_e4m3_code(f2, scale);
      } else {
        __nv_bfloat16* k_cache = static_cast<__nv_bfloat16*>(a.k_cache);
        k_cache[cache_index(g, i)] = o1;
        k_cache[cache_index(g, i + kRopeHalf)] = o2;
      }
    }
  }
  if (slot < 0) return;
  const __nv_bfloat16* v = row + (hq + hkv) * kRopeHeadDim;
  for (int e = threadIdx.x; e < hkv * kRopeHeadDim; e += kThreads) {
    const int g = e / kRopeHeadDim;
    if constexpr (kFp8)
      static_cast<uint8_t*>(a.v_cache)[cache_index(g, e % kRopeHeadDim)] =
          kv_e4m3_code(__bfloat162float(v[e]), a.v_scale[g]);
    else
      static_cast<__nv_bfloat16*>(a.v_cache)[cache_index(g, e % kRopeHeadDim)] = v[e];
  }
}

// The one-token QKV projection with RoPE and the KV write in its epilogue (rope_cache.cuh). Warp u
// takes rows i and i + 32 of head u / 32 (i = u % 32): the two rows a rotation pair needs, so lane 0
// holds both sums (gemv_common.cuh's two-row dot: each sum bit-identical to bf16_gemv's), adds the
// bias, rounds to bf16 as the linear's output is, rotates q and k heads as bf16_rope_kv_cache_write
// does, writes the qkv row and the k / v cache slots. (Hq + 2 Hkv) x 32 warps, 8 a CTA, 3 CTAs an SM
// (at most 85 registers): one wave for gpt-oss (320 CTAs).
// kFoldNorm: the RMSNorm before the projection in the prologue (QkvRopeArgs::fold_norm): after the PDL
// wait, with the weight rows already streaming, the CTA's 256 threads normalize the residual row into
// shared memory as f32_rmsnorm_vec4's 256 do (norm_row.cuh), and the dot products read it from there.
constexpr int kFusedWarps = 8;
static_assert(kFusedWarps * 32 == kNormThreads, "the folded norm's thread layout is the norm kernel's");

template <KvCacheElem kElem, bool kFoldNorm>
__global__ void __launch_bounds__(kFusedWarps * 32, 3) bf16_gemv_qkv_rope_kv_write(QkvRopeArgs a) {
  const RopeCacheWriteArgs& r = a.rope;
  const int hq = r.num_q_heads, hkv = r.num_kv_heads;
  const int units = (hq + 2 * hkv) * kRopeHalf;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int unit = min(int(blockIdx.x) * kFusedWarps + warp, units - 1);  // spare warps redo the last unit's loads
  const int head = unit / kRopeHalf, i = unit % kRopeHalf;
  const int row0 = head * kRopeHeadDim + i, row1 = row0 + kRopeHalf;
  const uint16_t* const w[2] = {a.w + int64_t(row0) * a.k, a.w + int64_t(row1) * a.k};
  float sum[2];
  if constexpr (kFoldNorm) {
    __shared__ __align__(16) uint16_t x_s[kNormMaxVecHidden];
    gemv_rows_dot_one_token<2, /*kXShared=*/true>(a.x, w, a.k, sum, [&](const uint16_t*) -> const uint16_t* {
      rmsnorm_row_vec4(a.norm, 0, /*write_residual=*/blockIdx.x == 0, /*normalize=*/true, [&](int v, const float4& y) {
        uint2 packed;
        packed.x = pack_bf16x2(y.x, y.y);
        packed.y = pack_bf16x2(y.z, y.w);
        *reinterpret_cast<uint2*>(x_s + 4 * v) = packed;
      });
      __syncthreads();
      return x_s;
    });
  } else {
    gemv_rows_dot_one_token<2>(a.x, w, a.k, sum);
  }
  __shared__ float cos_s[kRopeHalf], sin_s[kRopeHalf];
  if (warp == 0) rope_cos_sin(r, r.positions[0], lane, cos_s[lane], sin_s[lane]);
  __syncthreads();
  if (lane != 0 || int(blockIdx.x) * kFusedWarps + warp >= units) return;
  const float b0 = a.bias ? bf16_bits_to_float(a.bias[row0]) : 0.f;
  const float b1 = a.bias ? bf16_bits_to_float(a.bias[row1]) : 0.f;
  __nv_bfloat16 y0 = __float2bfloat16_rn(sum[0] + b0), y1 = __float2bfloat16_rn(sum[1] + b1);
  float f0 = __bfloat162float(y0), f1 = __bfloat162float(y1);  // v's values; k's are rotated below
  if (head < hq + hkv) {
    rope_rotate_f32(f0, f1, cos_s[i], sin_s[i], f0, f1);
    y0 = __float2bfloat16_rn(f0), y1 = __float2bfloat16_rn(f1);
  }
  r.qkv[row0] = y0;
  r.qkv[row1] = y1;
  const int slot = r.slots[0];
  if (slot < 0 || head < hq) return;
  const bool is_k = head < hq + hkv;
  kv_cache_store_pair<kElem>(r, is_k, slot, is_k ? head - hq : head - hq - hkv, i, f0, f1, y0, y1);
}

}  // namespace

bool qkv_rope_fused_supported(const QkvRopeArgs& a) {
  const bool shapes = a.rope.num_tokens == 1 && a.k >= 8 && a.k % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(a.w) % 16 == 0 && a.rope.num_q_heads > 0 && a.rope.num_kv_heads > 0;
  if (!a.fold_norm) return shapes && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
  const RmsNormArgs& n = a.norm;
  return shapes && n.rows == 1 && n.hidden == a.k && n.residual != nullptr && n.residual_out != nullptr &&
         n.residual_out != n.residual && n.delta.data != nullptr && n.weight.data != nullptr &&
         rmsnorm_vec4_supported(n);
}

void launch_bf16_gemv_qkv_rope_kv_write(const QkvRopeArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(
      qkv_rope_fused_supported(a), "bf16_gemv_qkv_rope_kv_write: ", a.rope.num_tokens, " tokens, k ", a.k,
      " (one token, k a multiple of 8, 16-byte aligned x and w; a folded norm: one row of k values, "
      "residual and delta given, residual_out another buffer than residual, the norm kernel's vector alignment)");
  const int units = (a.rope.num_q_heads + 2 * a.rope.num_kv_heads) * kRopeHalf;
  const dim3 grid((units + kFusedWarps - 1) / kFusedWarps), block(kFusedWarps * 32);
  const bool fp8 = a.rope.kv_elem == KvCacheElem::Fp8E4m3;
  if (a.fold_norm)
    OSSRT_CUDA_CALL(launch_pdl(fp8 ? bf16_gemv_qkv_rope_kv_write<KvCacheElem::Fp8E4m3, true>
                                   : bf16_gemv_qkv_rope_kv_write<KvCacheElem::Bf16, true>,
                               grid, block, stream, a));
  else
    OSSRT_CUDA_CALL(launch_pdl(fp8 ? bf16_gemv_qkv_rope_kv_write<KvCacheElem::Fp8E4m3, false>
                                   : bf16_gemv_qkv_rope_kv_write<KvCacheElem::Bf16, false>,
                               grid, block, stream, a));
}

cudaError_t launch_bf16_rope_kv_cache_write(const RopeCacheWriteArgs& args, cudaStream_t stream) {
  if (args.num_tokens <= 0) return cudaSuccess;
  if (args.kv_elem == KvCacheElem::Fp8E4m3)
    return launch_pdl(bf16_rope_kv_cache_write<KvCacheElem::Fp8E4m3>, dim3(args.num_tokens), dim3(kThreads), stream,
                      args);
  return launch_pdl(bf16_rope_kv_cache_write<KvCacheElem::Bf16>, dim3(args.num_tokens), dim3(kThreads), stream, args);
}

}  // namespace ossrt::cuda
