#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/l2_prefetch.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 128;
constexpr uint64_t kChunk = 64 << 10;  // bytes per prefetch instruction

__device__ __forceinline__ void bulk_prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_prefetch_l2_evict_last(const void* p, uint32_t bytes, uint64_t policy) {
  asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(p), "r"(bytes), "l"(policy)
               : "memory");
}

__global__ void __launch_bounds__(kThreads) l2_prefetch(L2PrefetchArgs a) {
  // The weights are written by no kernel: the prefetches go out before the dependency wait, and the
  // next kernel may launch at once (its own wait orders it after this one, which waits below).
  pdl_launch_dependents();
  uint64_t policy = 0;
  if (a.evict_last) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  // Chunk i of all ranges together goes to thread i mod (threads of the grid).
  const uint64_t threads = uint64_t(gridDim.x) * kThreads;
  const uint64_t me = uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  uint64_t first = 0;  // global index of the current range's chunk 0
  for (int r = 0; r < a.count; ++r) {
    const char* base = static_cast<const char*>(a.ptr[r]);
    const uint64_t size = a.bytes[r] / 16 * 16;
    const uint64_t chunks = (size + kChunk - 1) / kChunk;
    for (uint64_t c = (me + threads - first % threads) % threads; c < chunks; c += threads) {
      const uint32_t n = uint32_t(size - c * kChunk < kChunk ? size - c * kChunk : kChunk);
      if (a.evict_last)
        bulk_prefetch_l2_evict_last(base + c * kChunk, n, policy);
      else
        bulk_prefetch_l2(base + c * kChunk, n);
    }
    first += chunks;
  }
  pdl_wait();  // keeps the PDL chain transitive (attention_moe_common.cuh)
}

}  // namespace

cudaError_t launch_l2_prefetch(const L2PrefetchArgs& args, cudaStream_t stream) {
  if (args.count <= 0) return cudaSuccess;
  return launch_pdl(l2_prefetch, dim3(1), dim3(kThreads), stream, args);
}

}  // namespace ossrt::cuda
