#pragma once
// Tensor: a non-owning, typed, row-major view of memory on one device. Ownership lives in the
// backend that allocated it (weights and workspaces are planned at start-up), or in a HostBuffer.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace ossrt {

enum class Device : uint8_t { CPU, CUDA };

inline constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev = Device::CPU)
      : data(d), dtype(t), device(dev) {
    OSSRT_CHECK(dims.size() <= kMaxDims, "tensor rank {} > {}", dims.size(), kMaxDims);
    for (int64_t v : dims) shape[ndim++] = v;
  }

  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  // Elements per leading-dimension row (the product of the other dimensions; also for 0 rows, which
  // a step without logit rows has, so no division by the row count).
  int64_t row_elems() const {
    int64_t n = 1;
    for (int i = 1; i < ndim; ++i) n *= shape[i];
    return n;
  }

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  // Rows [begin, begin + count) of dimension 0, as a view of the same memory.
  Tensor rows(int64_t begin, int64_t count) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + size_t(begin * row_elems()) * dtype_size(dtype);
    t.shape[0] = count;
    return t;
  }

  std::string shape_str() const;
};

}  // namespace ossrt
