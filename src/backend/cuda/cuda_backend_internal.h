#pragma once
// CudaBackend's private state shared by its translation units (cuda_*.cpp). Not for other modules.
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/fp8_linear.cuh"
#include "backend/cuda/kernels/greedy_screen.cuh"
#include "backend/cuda/kernels/kv_cache_elem.cuh"

namespace ossrt {

struct CudaBackend::KvStorage {
  struct Group {
    std::vector<void*> k, v;  // per layer of the group: elem [num_blocks][Hkv][block_size][64]
    int num_blocks = 0;       // including the scratch block
    int scratch_block = 0;    // the extra last block padded graph rows use
    // Bf16, or Fp8E4m3 for the full group under --kv-cache-dtype fp8, with the scales on the device:
    // per layer, fp32 [Hkv] for K and for V.
    cuda::KvCacheElem elem = cuda::KvCacheElem::Bf16;
    std::vector<const float*> k_scale, v_scale;
  };
  KvCacheShape shape;     // as the engine asked
  KvCacheShape internal;  // with the scratch block added to each pool
  Group full, window;
  std::vector<void*> allocations;  // one per group, released when the storage is replaced
  const Group& group(KvGroup g) const { return g == KvGroup::Full ? full : window; }
};

// The greedy screen of the unembedding whose data is `lm_head` (upload_unembedding).
struct CudaBackend::GreedyScreen {
  const void* lm_head = nullptr;
  cuda::GreedyScreenWeights weights;
  cuda::GreedyScreenState state;
};

template <typename KernelArgs>
void CudaBackend::set_layer_cache(KernelArgs& a, const KvStorage& kv, KvGroup group, int layer) {
  const KvStorage::Group& g = kv.group(group);
  a.k_cache = g.k[size_t(layer)];
  a.v_cache = g.v[size_t(layer)];
  a.kv_elem = g.elem;
  if (g.elem == cuda::KvCacheElem::Fp8E4m3) {
    a.k_scale = g.k_scale[size_t(layer)];
    a.v_scale = g.v_scale[size_t(layer)];
  }
}

// An FP8 linear weight (upload_linear in Fp8 / Mxfp4Fp8): the Tensor's data are e4m3 codes [n, k_pad]
// (zeros past k); scales [scale rows][k_pad / 128] row-major, each part on its own grid (parts);
// blas_scales the same in the layout cuBLASLt takes (cublas_fp8.h; scales itself or a transposed copy).
struct CudaBackend::Fp8Weight {
  const float* scales = nullptr;
  const float* blas_scales = nullptr;
  int n = 0, k = 0, k_pad = 0;
  cuda::Fp8Parts parts;
  // Every part starts at a multiple of 128 rows, so the fused weight's grid is its parts' grids and
  // one block-scaled GEMM computes it (all gpt-oss weights); tiny models' parts need not.
  bool grid_aligned = true;
};

}  // namespace ossrt
