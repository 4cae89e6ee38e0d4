#pragma once
// Loads from shared memory by shared-window (32-bit) address. Kernels that align their dynamic shared
// memory by integer arithmetic on the pointer lose its address space, so plain C++ loads through it
// compile to generic loads (LD, with the address-window check and a longer latency) instead of LDS.
#include <cstdint>

namespace ossrt::cuda {

// The dynamic shared memory `raw` rounded up to kAlign bytes (in the shared window, where the
// 128-byte swizzle's phase is taken) as an offset from `raw` itself, so the compiler still knows the
// result points to shared memory and plain loads and stores through it stay LDS / STS.
template <uint32_t kAlign>
__device__ __forceinline__ uint8_t* align_dynamic_smem(uint8_t* raw) {
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  return raw + (((base + kAlign - 1) & ~(kAlign - 1)) - base);
}

__device__ __forceinline__ uint4 lds_u32x4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr) : "memory");
  return v;
}

}  // namespace ossrt::cuda
