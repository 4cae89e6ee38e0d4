#include "backend/cuda/kernels/rope_cache.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;

// One block per token. Each thread owns whole (head, i) rotation pairs, so the rotated k it writes
// to the cache is the value it just computed: no barrier between rotation and cache write.
__global__ void bf16_rope_kv_cache_write(RopeCacheWriteArgs a) {
  const int t = blockIdx.x;
  const int hq = a.num_q_heads, hkv = a.num_kv_heads;
  const int row_elems = (hq + 2 * hkv) * kRopeHeadDim;
  __nv_bfloat16* row = a.qkv + int64_t(t) * row_elems;
  const float pos = float(a.positions[t]);
  const int slot = a.slots[t];
  const int64_t block = slot >= 0 ? slot / a.block_size : 0;
  const int offset = slot >= 0 ? slot % a.block_size : 0;
  auto cache_index = [&](int g, int d) {
    return ((block * hkv + g) * a.block_size + offset) * int64_t(kRopeHeadDim) + d;
  };

  // q and k heads are contiguous: q heads 0..hq-1 then k heads hq..hq+hkv-1.
  const int rotated_pairs = (hq + hkv) * kRopeHalf;
  for (int p = threadIdx.x; p < rotated_pairs; p += kThreads) {
    const int head = p / kRopeHalf, i = p % kRopeHalf;
    // sincosf (not __sincosf): angles reach ~1e5 rad at long contexts, where the fast
    // intrinsic's range reduction is far too coarse.
    float s, c;
    sincosf(pos * a.inv_freq[i], &s, &c);
    c *= a.concentration;
    s *= a.concentration;
    __nv_bfloat16* x = row + head * kRopeHeadDim;
    const float x1 = __bfloat162float(x[i]), x2 = __bfloat162float(x[i + kRopeHalf]);
    const __nv_bfloat16 o1 = __float2bfloat16_rn(x1 * c - x2 * s);
    const __nv_bfloat16 o2 = __float2bfloat16_rn(x2 * c + x1 * s);
    x[i] = o1;
    x[i + kRopeHalf] = o2;
    if (head >= hq && slot >= 0) {
      const int g = head - hq;
      a.k_cache[cache_index(g, i)] = o1;
      a.k_cache[cache_index(g, i + kRopeHalf)] = o2;
    }
  }
  if (slot < 0) return;
  const __nv_bfloat16* v = row + (hq + hkv) * kRopeHeadDim;
  for (int e = threadIdx.x; e < hkv * kRopeHeadDim; e += kThreads) {
    a.v_cache[cache_index(e / kRopeHeadDim, e % kRopeHeadDim)] = v[e];
  }
}

}  // namespace

cudaError_t launch_bf16_rope_kv_cache_write(const RopeCacheWriteArgs& args, cudaStream_t stream) {
  if (args.num_tokens <= 0) return cudaSuccess;
  bf16_rope_kv_cache_write<<<args.num_tokens, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ossrt::cuda
