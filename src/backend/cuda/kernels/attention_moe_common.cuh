#pragma once
// Device helpers shared by the attention and MoE kernels: bf16 packing, the sm_80-style
// mma.sync m16n8k16 (bf16 in, fp32 accumulate; runs at full rate on sm_90), cp.async, and the
// launch check. Only device/launcher .cu files include this (it pulls in cuda_bf16.h).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/error_type.h"

namespace ossrt::cuda {

// nvcc cannot compile fmt's C++20 format-string checks, so launchers build error messages by
// concatenation: fail_in_cu("attention: window ", w, " is negative") throws ossrt::Error.
inline std::string message_piece(const char* s) { return s; }
inline std::string message_piece(const std::string& s) { return s; }
template <typename T>
  requires std::is_arithmetic_v<T>
std::string message_piece(T v) {
  return std::to_string(v);
}
template <typename... Parts>
[[noreturn]] void fail_in_cu(const Parts&... parts) {
  std::string message;
  ((message += message_piece(parts)), ...);
  throw ::ossrt::Error(message);
}

#define OSSRT_CU_CHECK(cond, ...)                        \
  do {                                                   \
    if (!(cond)) ::ossrt::cuda::fail_in_cu(__VA_ARGS__); \
  } while (0)

// After a <<< >>> launch: turns a launch error (bad grid, too many resources) into an ossrt::Error
// naming the kernel and the launch site. cudaGetLastError does not synchronize (legal in capture).
#define OSSRT_CHECK_LAUNCH(kernel_name)                                               \
  do {                                                                                \
    cudaError_t launch_err_ = cudaGetLastError();                                     \
    if (launch_err_ != cudaSuccess)                                                   \
      ::ossrt::cuda::fail_in_cu(__FILE__, ":", __LINE__, ": launch of ", kernel_name, \
                                " failed: ", cudaGetErrorString(launch_err_));        \
  } while (0)

// Every runtime call in the launchers (memsets) goes through this: file:line and the call.
#define OSSRT_CUDA_CALL(call)                                                                                      \
  do {                                                                                                             \
    cudaError_t call_err_ = (call);                                                                                \
    if (call_err_ != cudaSuccess)                                                                                  \
      ::ossrt::cuda::fail_in_cu(__FILE__, ":", __LINE__, ": ", #call, " failed: ", cudaGetErrorString(call_err_)); \
  } while (0)

inline constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

// Two floats -> one 32-bit register holding bf16(lo) in the low half (the lower-indexed element,
// as the mma fragments expect).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Two floats -> f16x2 (lo in the low half), round to nearest.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// d += a * b for one m16n8k32 tile of e4m3 codes, fp32 accumulation (sm_89+; the FP8
// linears and the FP8 MoE). Fragments (g = lane / 4,
// c = lane % 4), each register 4 consecutive k of one row or column:
//   a[0] = A[g][4c..], a[1] = A[g + 8][4c..], a[2] = A[g][16 + 4c..], a[3] = A[g + 8][16 + 4c..]
//   b[0] = B[4c..][g], b[1] = B[16 + 4c..][g]; d[0..1] = D[g][2c..2c+1], d[2..3] = D[g + 8][2c..2c+1]
__device__ __forceinline__ void mma_e4m3_m16n8k32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a * b for one m16n8k16 tile. Fragment layout (g = lane / 4, c = lane % 4):
//   a[0] = A[g][2c..2c+1], a[1] = A[g+8][2c..], a[2] = A[g][2c+8..], a[3] = A[g+8][2c+8..]
//   b[0] = B[2c..2c+1][g], b[1] = B[2c+8..2c+9][g]
//   d[0..1] = D[g][2c..2c+1], d[2..3] = D[g+8][2c..2c+1]
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a * b for one m16n8k16 tile of f16 (fragment layout as mma_bf16_m16n8k16's; the fp8 KV
// cache's decode attention, whose e4m3 codes convert to f16 exactly in one instruction a pair).
__device__ __forceinline__ void mma_f16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 32-bit load of two adjacent bf16 from shared memory (fragment element pairs).
__device__ __forceinline__ uint32_t lds_u32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// 16-byte global -> shared copy that bypasses registers; src_bytes = 0 zero-fills the destination
// (used for rows past the end of a group, so the MMA sees zeros instead of stale data).
// The same to a shared-memory address already in the shared window (__cvta_generic_to_shared), for
// loops that compute a thread's destinations once and step them by constants.
__device__ __forceinline__ void cp_async_16_to(uint32_t smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  cp_async_16_to(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst)), gmem_src, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// 16-byte global load for data read once per step (weights): no L1 allocation, so the L1 keeps what
// is reused (activations).
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Pulls the line holding p into L2 (weights that are read right after, e.g. before a PDL wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Programmatic dependent launch (sm_90; docs/kernels.md, "MXFP4 MoE"): a kernel launched with
// launch_pdl may start while the previous kernel in the stream still runs; pdl_wait() blocks until
// that kernel has completed and its writes are visible (a no-op when launched plainly), and
// pdl_launch_dependents() lets the next PDL-launched kernel start once every CTA of this one called
// it (or exited). Only what precedes pdl_wait() overlaps: it must not read the previous kernel's output.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

// Runs a CUDA call once per device: kernel attributes such as the dynamic shared-memory limit belong
// to each device's context, and expert-parallel ranks drive a device each from their own host thread
// (a process-wide `static` would set them on the first device only). Two threads racing on one
// device only repeat the call, which is harmless for attributes.
class PerDeviceOnce {
 public:
  template <typename F>
  cudaError_t run(F&& call) {
    int device = 0;
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    const bool tracked = device >= 0 && device < kMaxDevices;
    if (tracked && done_[device].load(std::memory_order_acquire)) return cudaSuccess;
    const cudaError_t e = call();
    if (e == cudaSuccess && tracked) done_[device].store(true, std::memory_order_release);
    return e;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<bool> done_[kMaxDevices] = {};
};

// OSSRT_CUDA_PDL=0 (developer switch, read once): launch_pdl launches plainly, every kernel after the
// one before has completed, to measure what the overlap buys.
inline bool pdl_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("OSSRT_CUDA_PDL");
    return !(v && v[0] == '0');
  }();
  return allowed;
}

// launch_pdl_smem: the same with `smem` bytes of dynamic shared memory.
template <typename... Params, typename... Args>
cudaError_t launch_pdl_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                            Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = pdl_allowed() ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  return launch_pdl_smem(kernel, grid, block, 0, stream, args...);
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace ossrt::cuda
