#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/rope_cache.cuh"

namespace ossrt::cuda {
namespace {

// 768 threads: the (64 + 8) x 32 rotation pairs of a gpt-oss token are 3 per thread, so a decode
// token costs one round of loads rather than nine (the kernel is latency-bound at one token).
constexpr int kThreads = 768;

// One block per token. The 32 (cos, sin) pairs of the token are computed once into shared memory
// (double sincos on 32 threads per token is negligible next to the memory traffic),
// then each thread owns whole (head, i) rotation pairs, so the rotated k it writes to the cache is
// the value it just computed: no barrier between rotation and cache write.
__global__ void __launch_bounds__(kThreads) bf16_rope_kv_cache_write(RopeCacheWriteArgs a) {
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
  if (threadIdx.x < kRopeHalf) {
    // The reference's arithmetic, as the CPU backend's rope_cos_sin (backend/backend.h): the angle is
    // one float32 product (HF: float32 inv_freq @ positions), cos/sin of that float32 angle (double
    // sincos rounded once), then times the float32 concentration. _rn intrinsics: no FMA contraction.
    const float angle = __fmul_rn(__int2float_rn(a.positions[t]), a.inv_freq[threadIdx.x]);
    double s, c;
    sincos(double(angle), &s, &c);
    cos_s[threadIdx.x] = __fmul_rn(__double2float_rn(c), a.concentration);
    sin_s[threadIdx.x] = __fmul_rn(__double2float_rn(s), a.concentration);
  }
  __syncthreads();

  // q and k heads are contiguous: q heads 0..hq-1 then k heads hq..hq+hkv-1.
  const int rotated_pairs = (hq + hkv) * kRopeHalf;
  for (int p = threadIdx.x; p < rotated_pairs; p += kThreads) {
    const int head = p / kRopeHalf, i = p % kRopeHalf;
    const float c = cos_s[i], s = sin_s[i];
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
  return launch_pdl(bf16_rope_kv_cache_write, dim3(args.num_tokens), dim3(kThreads), stream, args);
}

}  // namespace ossrt::cuda
