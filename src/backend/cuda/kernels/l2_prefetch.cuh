#pragma once
// L2 prefetch of weights a later kernel of the step reads (Backend::prefetch_weights): one small
// PDL-launched kernel issues Hopper's bulk L2 prefetches (cp.async.bulk.prefetch.L2) for the ranges
// and returns without waiting for the data, so the DRAM reads overlap the kernels that follow
// (docs/kernels.md, "Weights pulled into L2 ahead of use").
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ossrt::cuda {

struct L2PrefetchArgs {
  static constexpr int kMaxRanges = 8;
  const void* ptr[kMaxRanges] = {};
  uint64_t bytes[kMaxRanges] = {};  // each range's start is 16-byte aligned; its size is cut to a multiple of 16
  int count = 0;
  bool evict_last = false;  // the lines get L2's evict_last priority (they outlive streamed data)
};

cudaError_t launch_l2_prefetch(const L2PrefetchArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
