#pragma once
// Raw device memory for the kernel tests that launch kernels directly (attention, MoE, FP8 linear):
// an owning device copy of a host vector, or scratch, freed on scope exit.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace ossrt::test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
class DeviceArray {
 public:
  // A device copy of `host` (download() returns it back).
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    cuda_ok(cudaMalloc(&ptr_, std::max<size_t>(1, n_) * sizeof(T)), "cudaMalloc");
    if (n_) cuda_ok(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  // Uninitialised scratch of `bytes` bytes (download() returns nothing).
  explicit DeviceArray(size_t bytes) : n_(0) { cuda_ok(cudaMalloc(&ptr_, std::max<size_t>(1, bytes)), "cudaMalloc"); }
  // Uninitialised storage of n elements (download() returns them).
  static std::unique_ptr<DeviceArray> empty(size_t n) {
    auto a = std::make_unique<DeviceArray>(n * sizeof(T));
    a->n_ = n;
    return a;
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) cuda_ok(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

}  // namespace ossrt::test
