#pragma once
// CudaBackend's private state shared by its translation units (cuda_*.cpp). Not for other modules.
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace ossrt {

struct CudaBackend::KvStorage {
  struct Group {
    std::vector<void*> k, v;  // per layer of the group: bf16 [num_blocks][Hkv][block_size][64]
    int num_blocks = 0;       // including the scratch block
    int scratch_block = 0;    // the extra last block padded graph rows use
  };
  KvCacheShape shape;     // as the engine asked
  KvCacheShape internal;  // with the scratch block added to each pool
  Group full, window;
  std::vector<void*> allocations;  // one per group, released when the storage is replaced
  const Group& group(KvGroup g) const { return g == KvGroup::Full ? full : window; }
};

}  // namespace ossrt
