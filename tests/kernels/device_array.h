#pragma once
// Raw device memory for the kernel tests that launch kernels directly (attention, MoE, FP8 linear, FP8
// KV cache): an owning device copy of a host vector, or scratch, freed on scope exit; a StepPlan's
// arrays on the device with the DevicePlan view the kernels take.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/kernels/device_plan.cuh"
#include "backend/step_plan.h"
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

// A StepPlan uploaded verbatim, and the DevicePlan the kernels take.
struct DevicePlanStorage {
  DeviceArray<int32_t> positions, token_seq, full_slots, window_slots, full_table, window_table;
  DeviceArray<SeqStep> seqs;
  cuda::DevicePlan view;

  explicit DevicePlanStorage(const StepPlan& plan)
      : positions(plan.positions),
        token_seq(plan.token_seq),
        full_slots(plan.full_slots),
        window_slots(plan.window_slots),
        full_table(plan.full_block_table),
        window_table(plan.window_block_table),
        seqs(plan.seqs) {
    view.num_tokens = plan.num_tokens();
    view.num_seqs = plan.num_seqs();
    view.block_size = plan.block_size;
    view.max_context = plan.max_context();
    for (const SeqStep& s : plan.seqs) view.max_seq_tokens = std::max(view.max_seq_tokens, s.num_tokens);
    view.positions = positions.get();
    view.token_seq = token_seq.get();
    view.full_slots = full_slots.get();
    view.window_slots = window_slots.get();
    view.seqs = seqs.get();
    view.full_block_table = full_table.get();
    view.window_block_table = window_table.get();
  }
};

}  // namespace ossrt::test
