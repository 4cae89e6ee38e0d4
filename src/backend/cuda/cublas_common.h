#pragma once
// What the two cuBLASLt users (cublas_linear.cpp: bf16 GEMMs; cublas_fp8.cpp: block-scaled FP8)
// share: the workspace size, and the pointer alignment a cached plan is keyed on.
#include <cstddef>
#include <cstdint>

namespace ossrt::cuda {

// 32 MiB: what NVIDIA recommends for Hopper so the heuristic may pick split-K / stream-K kernels.
inline constexpr size_t kCublasWorkspaceBytes = 32u << 20;

// The largest power of two up to 256 that divides the address (1 for an odd one): cuBLASLt's
// heuristic answers for one alignment, so a plan is cached per alignment.
inline int cublas_pointer_alignment(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && addr % uintptr_t(align) != 0) align /= 2;
  return align;
}

}  // namespace ossrt::cuda
