#pragma once
// YaRN RoPE on q and k of the fused qkv rows (half-split / NeoX, docs/reference/SPEC.md 2.5), then k and v written
// into one layer's paged KV cache [num_blocks][num_kv_heads][block_size][head_dim]: bf16, or e4m3 codes
// of value / scale (kv_cache_elem.cuh; K quantized from the rotation's fp32 result, as the CPU oracle,
// which caches fp32 K, quantizes it: rounding to bf16 first would round twice; V from its bf16 value).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels/kv_cache_elem.cuh"
#include "backend/cuda/kernels/norm.cuh"

namespace ossrt::cuda {

inline constexpr int kRopeHeadDim = 64;  // gpt-oss head dim; the only one the CUDA path builds
inline constexpr int kRopeHalf = kRopeHeadDim / 2;

struct RopeCacheWriteArgs {
  __nv_bfloat16* qkv;        // [num_tokens, (Hq + 2 Hkv) * 64], rotated in place
  const int32_t* positions;  // [num_tokens] absolute positions
  const int32_t* slots;      // [num_tokens] block_id * block_size + offset; < 0 = do not cache
  void* k_cache;             // this layer's K storage, kv_elem elements
  void* v_cache;             // this layer's V storage, kv_elem elements
  KvCacheElem kv_elem;       // Bf16 unless the layer's cache is fp8
  const float* k_scale;      // Fp8E4m3: this layer's scales, fp32 [num_kv_heads] each on the device
  const float* v_scale;
  int num_tokens;
  int num_q_heads;
  int num_kv_heads;
  int block_size;
  // Passed by value (128 bytes) so a captured graph never depends on a host buffer's lifetime.
  // RopeParams::inv_freq, float32 bit for bit as HF transformers makes it; the kernel forms the angle
  // as the reference does, one float32 product position * inv_freq (docs/cuda_backend.md, RoPE).
  float inv_freq[kRopeHalf];
  float concentration;  // YaRN attention factor multiplying cos and sin (float32)
};

cudaError_t launch_bf16_rope_kv_cache_write(const RopeCacheWriteArgs& args, cudaStream_t stream);

// One-token steps: the QKV projection qkv = x w^T + bias (bf16 [Hq + 2 Hkv heads x 64, k]) with the
// rotation and the cache write of launch_bf16_rope_kv_cache_write in its epilogue; qkv and the cache
// get exactly what the one-row bf16_gemv followed by that kernel write.
struct QkvRopeArgs {
  const uint16_t* x;     // bf16 [1, k]; not read when fold_norm
  const uint16_t* w;     // bf16 [(Hq + 2 Hkv) * 64, k]
  const uint16_t* bias;  // bf16 [(Hq + 2 Hkv) * 64] or null
  int k;
  RopeCacheWriteArgs rope;  // num_tokens 1; rope.qkv is the projection's output
  // The RMSNorm before the projection, folded in (one row; norm.out unused): each CTA makes x itself,
  // rmsnorm(residual + delta) * weight with launch_f32_rmsnorm's arithmetic (norm_row.cuh), in shared
  // memory, and CTA 0 writes residual + delta to norm.residual_out, which must not be norm.residual
  // (the other CTAs still read it). Saves the norm kernel's launch and its trip through memory.
  bool fold_norm = false;
  RmsNormArgs norm{};
};

// Whether launch_bf16_gemv_qkv_rope_kv_write takes these arguments, fold_norm's included.
bool qkv_rope_fused_supported(const QkvRopeArgs& args);
void launch_bf16_gemv_qkv_rope_kv_write(const QkvRopeArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
