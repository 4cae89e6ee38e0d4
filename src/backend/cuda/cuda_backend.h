#pragma once
#include <memory>

#include "backend/backend.h"

namespace ossrt {
// The CUDA backend for sm_90a (H100/H200).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
}  // namespace ossrt
