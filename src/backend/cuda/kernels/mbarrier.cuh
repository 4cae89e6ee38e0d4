#pragma once
// Shared-memory mbarriers for the warp-specialized pipelines (a producer warpgroup fills a ring of
// stages with cp.async (and bulk copies), consumers wait on each stage's `full` barrier and release it on its `empty`
// one): moe_mxfp4_wgmma_pipe.cu, moe_fp8_wgmma_pipe.cu.
#include <cstdint>

namespace ossrt::cuda {

// mbarrier operations (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier");
// addresses are shared-window (32-bit) ones.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.shared::cta.b64 state, [%0];\n"
      "}\n" ::"r"(bar)
      : "memory");
}
// One arrival on `bar` once every cp.async this thread issued before has landed (.noinc: the
// barrier's expected count includes it).
__device__ __forceinline__ void mbar_arrive_when_copied(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Adds `bytes` to the transaction count the current phase of `bar` waits for (no arrival): the
// bytes of bulk copies this thread issues next with complete_tx on `bar`. Issued before the copies
// and before this thread's own arrival, so the phase cannot complete without them.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory by the
// SM's bulk-copy (TMA) unit rather than by 16-byte cp.async instructions through the load/store
// pipe; on landing they count against `bar`'s transaction count (mbar_expect_tx).
__device__ __forceinline__ void bulk_copy_to_smem(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Blocks until the phase of `bar` with parity `parity` has completed (a fresh barrier counts its
// phase "before" the first, parity 1, as completed).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

}  // namespace ossrt::cuda
