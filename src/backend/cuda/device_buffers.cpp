#include "backend/cuda/device_buffers.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"

namespace ossrt::cuda {

DeviceBuffers::~DeviceBuffers() {
  // No checks here: a destructor must not throw, and the process may be tearing down the context.
  for (auto& [p, a] : device_) cudaFree(p);
  for (void* p : pinned_) cudaFreeHost(p);
}

size_t DeviceBuffers::bytes(BufferKind kind) const {
  switch (kind) {
    case BufferKind::Weights: return weights_bytes_;
    case BufferKind::Workspace: return workspace_bytes_;
    case BufferKind::KvCache: return kv_bytes_;
  }
  return 0;
}

void DeviceBuffers::release(void* p) {
  auto it = device_.find(p);
  OSSRT_CHECK(it != device_.end(), "DeviceBuffers::release: {} was not allocated here", p);
  OSSRT_CUDA_CHECK(cudaFree(p));
  switch (it->second.kind) {
    case BufferKind::Weights: weights_bytes_ -= it->second.bytes; break;
    case BufferKind::Workspace: workspace_bytes_ -= it->second.bytes; break;
    case BufferKind::KvCache: kv_bytes_ -= it->second.bytes; break;
  }
  device_.erase(it);
}

void* DeviceBuffers::allocate(size_t bytes, const std::string& what, CUstream_st* capture_check_stream,
                              BufferKind kind) {
  if (capture_check_stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    OSSRT_CUDA_CHECK(cudaStreamIsCapturing(capture_check_stream, &status));
    OSSRT_CHECK(status == cudaStreamCaptureStatusNone,
                "device allocation of {} ({} bytes) during CUDA graph capture: memory must be planned at start-up",
                what, bytes);
  }
  if (bytes == 0) bytes = 256;  // a valid, unique pointer even for empty tensors
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();  // clear the sticky-free allocation error before querying
    cudaMemGetInfo(&free_b, &total_b);
    fail("out of device memory allocating {} ({:.1f} MiB; {:.1f} MiB free of {:.1f} MiB; ossrt holds {:.1f} MiB): {}",
         what, bytes / 1048576.0, free_b / 1048576.0, total_b / 1048576.0, device_bytes() / 1048576.0,
         cudaGetErrorString(err));
  }
  device_.emplace(p, Allocation{bytes, kind});
  switch (kind) {
    case BufferKind::Weights: weights_bytes_ += bytes; break;
    case BufferKind::Workspace: workspace_bytes_ += bytes; break;
    case BufferKind::KvCache: kv_bytes_ += bytes; break;
  }
  return p;
}

void* DeviceBuffers::allocate_pinned(size_t bytes, const std::string& what) {
  void* p = nullptr;
  cudaError_t err = cudaMallocHost(&p, bytes == 0 ? 256 : bytes);
  if (err != cudaSuccess)
    fail("pinned host allocation of {} ({} bytes) failed: {}", what, bytes, cudaGetErrorString(err));
  pinned_.push_back(p);
  return p;
}

}  // namespace ossrt::cuda
