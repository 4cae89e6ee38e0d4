#pragma once
// For tests only (attention_test's WgmmaTileProductsMatchTheHost): the two warpgroup products of the
// wgmma prefill attention (attention_prefill_wgmma.cu) on one tile, so that a wrong shared-memory
// descriptor or fragment layout shows up as a misplaced element of a plain product rather than as a
// wrong attention output.
#include <cstdint>

#include <cuda_runtime.h>

namespace ossrt::cuda {

// One warpgroup computes s = a k^T and o = p v (bf16 in, fp32 out, 64 x 64 each) exactly as the
// attention kernel does: a and p as A fragments from registers, k [64 keys][64 dims] as the K-major
// B operand (wgmma_desc_k128), v [64 keys][64 dims] as the MN-major B operand (wgmma_desc_mn128,
// imm-trans-b = 1), both tiles in shared memory with the 128-byte swizzle. All matrices row-major
// with 64 columns, device pointers (16-byte aligned); s and o are written whole.
void launch_wgmma_tile_check(const uint16_t* a, const uint16_t* k, const uint16_t* p, const uint16_t* v, float* s,
                             float* o, cudaStream_t stream);

// For timing only: the rate (dense TFLOP/s, every SM) of wgmma.m64nNk16 bf16 with A from registers and B
// from shared memory, issued as the MXFP4 pipe's consumers issue them (chunks of sets x 4, one chunk
// left running) by 1-3 warpgroups a CTA, one CTA an SM, with nothing else in the loop. Built for
// (n, sets) = (32, 2), (48, 1), (48, 2), (64, 1), (64, 2), (128, 1); `chunks` chunks a warpgroup
// (even). Synchronizes the device.
double wgmma_rs_rate_tflops(int n, int sets, int warpgroups, int chunks);

}  // namespace ossrt::cuda
