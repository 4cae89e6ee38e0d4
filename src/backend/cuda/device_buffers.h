#pragma once
// Owner of every device allocation the CUDA backend makes. Allocations happen at start-up only
// (weights, KV pool, workspaces); the owner counts them by kind so the memory plan can be
// reported, and refuses to allocate while a CUDA graph is being captured (an allocation there
// would be a bug on the step path). Only the KV storage is ever freed before the owner dies: the
// engine profiles one step on a small cache, then allocates the planned one.
#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

struct CUstream_st;

namespace ossrt::cuda {

enum class BufferKind { Weights, Workspace, KvCache };

class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  ~DeviceBuffers();
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  // cudaMalloc of `bytes` (256-byte aligned by CUDA); `what` names the buffer in errors.
  void* allocate(size_t bytes, const std::string& what, CUstream_st* capture_check_stream,
                 BufferKind kind = BufferKind::Workspace);
  // Frees one allocation made here (the caller synchronizes first).
  void release(void* p);
  // Page-locked host memory for staging (plan uploads); freed with the owner.
  void* allocate_pinned(size_t bytes, const std::string& what);
  size_t device_bytes() const { return weights_bytes_ + workspace_bytes_ + kv_bytes_; }
  size_t bytes(BufferKind kind) const;

 private:
  struct Allocation {
    size_t bytes;
    BufferKind kind;
  };
  std::unordered_map<void*, Allocation> device_;
  std::vector<void*> pinned_;
  size_t weights_bytes_ = 0, workspace_bytes_ = 0, kv_bytes_ = 0;
};

}  // namespace ossrt::cuda
