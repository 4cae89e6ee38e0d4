#pragma once
// Shared-memory mbarriers for the warp-specialized pipelines (a producer warpgroup fills a ring of
// stages with cp.async and TMA copies, consumers wait on each stage's `full` barrier and release it
// on its `empty` one): moe_mxfp4_wgmma_pipe.cu, moe_fp8_wgmma_pipe.cu, attention_prefill_wgmma_pipe.cu.
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
// bytes of the TMA copies this thread issues next with complete_tx on `bar`. Issued before the
// copies and before this thread's own arrival, so the phase cannot complete without them.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
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
