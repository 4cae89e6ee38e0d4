#include <algorithm>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/gemv_common.cuh"
#include "backend/cuda/kernels/norm_row.cuh"
#include "backend/cuda/kernels/rope_cache.cuh"
#include "backend/cuda/kernels/rope_common.cuh"

namespace ossrt::cuda {
namespace {

// One block per token, every load of the token issued before the first use: a thread owns 8
// consecutive rotation pairs of a head (elements i .. i + 7 and i + 32 .. i + 39, two 16-byte loads)
// or 8 consecutive v elements of a KV head (one), so gpt-oss's (64 + 8) x 4 rotation items and 8 x 8
// v items are 352 threads and one round trip to memory a token. (Before: 768 threads of one pair each,
// 2-byte loads in three rounds, each round's loads behind the previous round's stores, which may
// alias them: 129 us for an 8k prefill's 84 MB, H200.) The 32 (cos, sin) pairs are computed into
// shared memory while the loads are in flight (double sincos on 32 threads, negligible next to the
// traffic). A thread writes the rotated k it computed itself: no barrier between rotation and cache
// write. kElem: the cache's element type (an fp8 cache stores the codes of the fp32 rotation and of
// v, rope_cache.cuh).
constexpr int kPairsPerItem = 8;                              // rotation pairs (or v elements) a thread
constexpr int kItemsPerHead = kRopeHalf / kPairsPerItem;      // 4 rotation items a q or k head
constexpr int kVItemsPerHead = kRopeHeadDim / kPairsPerItem;  // 8 v items a KV head
constexpr int kMaxThreads = 1024;

// Work items a token: its rotation items, then its v items (the launcher rounds them up to whole warps
// and checks they fit one CTA).
__host__ __device__ constexpr int rope_items(int hq, int hkv) {
  return (hq + hkv) * kItemsPerHead + hkv * kVItemsPerHead;
}

// 8 bf16 as floats, and back (round to nearest even, as __float2bfloat16_rn).
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 p = unpack_bf16x2(w[j]);
    f[2 * j] = p.x, f[2 * j + 1] = p.y;
  }
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}

// The e4m3 codes of 8 values at one scale, the first in the low byte.
__device__ __forceinline__ uint2 e4m3_codes8(const float (&f)[8], float scale) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j / 4] |= uint32_t(kv_e4m3_code(f[j], scale)) << (8 * (j % 4));
  return make_uint2(w[0], w[1]);
}

// Elements d .. d + 7 of KV head g's row at cache slot `slot`: bf16 values (one 16-byte store) or
// their e4m3 codes over the head's scale (8 bytes). `f` are the fp32 values an fp8 cache quantizes
// (k: the rotation's, v: its bf16 values), `b` their bf16 bits.
template <KvCacheElem kElem>
__device__ __forceinline__ void kv_cache_store8(const RopeCacheWriteArgs& a, bool is_k, int slot, int g, int d,
                                                const float (&f)[8], const uint4& b) {
  const int64_t at = cache_index(a, slot, g, d);
  if constexpr (kElem == KvCacheElem::Fp8E4m3) {
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(is_k ? a.k_cache : a.v_cache) + at) =
        e4m3_codes8(f, (is_k ? a.k_scale : a.v_scale)[g]);
  } else {
    *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(is_k ? a.k_cache : a.v_cache) + at) = b;
  }
}

template <KvCacheElem kElem>
__global__ void __launch_bounds__(kMaxThreads) bf16_rope_kv_cache_write(RopeCacheWriteArgs a) {
  const int t = blockIdx.x;
  const int hq = a.num_q_heads, hkv = a.num_kv_heads;
  const int row_elems = (hq + 2 * hkv) * kRopeHeadDim;
  const int rotation_items = (hq + hkv) * kItemsPerHead;
  const int item = threadIdx.x;
  const bool rotates = item < rotation_items;
  const bool copies_v = !rotates && item < rope_items(hq, hkv);
  // Rotation item: head item / 4, pairs i0 .. i0 + 7; v item: KV head g, elements d0 .. d0 + 7.
  const int head = item / kItemsPerHead, i0 = (item % kItemsPerHead) * kPairsPerItem;
  const int v_item = item - rotation_items;
  const int g_v = v_item / kVItemsPerHead, d0 = (v_item % kVItemsPerHead) * kPairsPerItem;
  pdl_wait();  // launched with PDL: qkv comes from the kernel before
  pdl_launch_dependents();
  const int slot = a.slots[t];
  __nv_bfloat16* row = a.qkv + int64_t(t) * row_elems;
  uint4 lo{}, hi{};
  if (rotates) {
    lo = *reinterpret_cast<const uint4*>(row + head * kRopeHeadDim + i0);
    hi = *reinterpret_cast<const uint4*>(row + head * kRopeHeadDim + i0 + kRopeHalf);
  } else if (copies_v) {
    lo = *reinterpret_cast<const uint4*>(row + (hq + hkv) * kRopeHeadDim + g_v * kRopeHeadDim + d0);
  }
  __shared__ float cos_s[kRopeHalf], sin_s[kRopeHalf];
  if (threadIdx.x < kRopeHalf) rope_cos_sin(a, a.positions[t], threadIdx.x, cos_s[threadIdx.x], sin_s[threadIdx.x]);
  __syncthreads();
  if (rotates) {
    float x1[8], x2[8], o1[8], o2[8];
    unpack8(lo, x1);
    unpack8(hi, x2);
#pragma unroll
    for (int j = 0; j < 8; ++j) rope_rotate_f32(x1[j], x2[j], cos_s[i0 + j], sin_s[i0 + j], o1[j], o2[j]);
    const uint4 b1 = pack8(o1), b2 = pack8(o2);
    *reinterpret_cast<uint4*>(row + head * kRopeHeadDim + i0) = b1;
    *reinterpret_cast<uint4*>(row + head * kRopeHeadDim + i0 + kRopeHalf) = b2;
    if (head >= hq && slot >= 0) {
      kv_cache_store8<kElem>(a, true, slot, head - hq, i0, o1, b1);
      kv_cache_store8<kElem>(a, true, slot, head - hq, i0 + kRopeHalf, o2, b2);
    }
  } else if (copies_v && slot >= 0) {
    float v[8];
    unpack8(lo, v);
    kv_cache_store8<kElem>(a, false, slot, g_v, d0, v, lo);
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
  const int items = rope_items(args.num_q_heads, args.num_kv_heads);
  OSSRT_CU_CHECK(args.num_q_heads >= 1 && args.num_kv_heads >= 1 && items <= kMaxThreads, "rope: ", args.num_q_heads,
                 " q heads and ", args.num_kv_heads, " KV heads exceed one CTA's ", kMaxThreads, " threads");
  const dim3 threads((std::max(items, kRopeHalf) + 31) / 32 * 32);
  if (args.kv_elem == KvCacheElem::Fp8E4m3)
    return launch_pdl(bf16_rope_kv_cache_write<KvCacheElem::Fp8E4m3>, dim3(args.num_tokens), threads, stream, args);
  return launch_pdl(bf16_rope_kv_cache_write<KvCacheElem::Bf16>, dim3(args.num_tokens), threads, stream, args);
}

}  // namespace ossrt::cuda
