#pragma once
// Owner of every device allocation the CUDA backend makes. Allocations happen at start-up only
// (weights, KV pool, workspaces); the owner counts them so the memory plan can be reported, and
// refuses to allocate while a CUDA graph is being captured (an allocation there would be a bug on
// the step path).
#include <cstddef>
#include <string>
#include <vector>

struct CUstream_st;

namespace ossrt::cuda {

class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  ~DeviceBuffers();
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  // cudaMalloc of `bytes` (256-byte aligned by CUDA); `what` names the buffer in errors.
  void* allocate(size_t bytes, const std::string& what, CUstream_st* capture_check_stream);
  // Page-locked host memory for staging (plan uploads); freed with the owner.
  void* allocate_pinned(size_t bytes, const std::string& what);
  size_t device_bytes() const { return device_bytes_; }

 private:
  std::vector<void*> device_;
  std::vector<void*> pinned_;
  size_t device_bytes_ = 0;
};

}  // namespace ossrt::cuda
