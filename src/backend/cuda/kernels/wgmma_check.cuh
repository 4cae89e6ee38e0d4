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

}  // namespace ossrt::cuda
