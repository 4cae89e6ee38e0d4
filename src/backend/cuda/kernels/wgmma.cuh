#pragma once
// Hopper warpgroup MMA (sm_90a `wgmma.mma_async`) and the pieces around it, as the MXFP4 large-M
// MoE kernel (moe_mxfp4_wgmma.cu) and the wgmma prefill attention (attention_prefill_wgmma.cu) use
// them. PTX ISA, "Asynchronous Warpgroup Level Matrix Instructions": a warpgroup (4 consecutive
// warps, 128 threads) issues the MMA together; A comes from registers (each warp a 16 x 16 slice in
// mma.m16n8k16's A fragment layout) or shared memory, B from shared memory through a 64-bit matrix
// descriptor; D stays in registers, warp w holding rows 16w + g and 16w + g + 8 (g = lane / 4) and,
// per 8 columns j, columns 8j + 2c, 8j + 2c + 1 (c = lane % 4): d[4j + 0, 1] for row 16w + g,
// d[4j + 2, 3] for row 16w + g + 8.
#include <cstdint>

namespace ossrt::cuda {

// Descriptor of a K-major bf16 tile whose rows are exactly 128 bytes (64 elements) with the
// 128-byte swizzle (16-byte unit u of row r stored at unit u ^ (r % 8); tile base 1024-byte
// aligned): start address / 16 in bits 0-13, leading byte offset 16 (unused by this layout) in bits
// 16-29, stride byte offset 1024 (from one 8-row group to the next) in bits 32-45, swizzle mode 1
// (128 bytes) in bits 62-63. The k16 step s of the tile starts 32 s bytes in.
__device__ __forceinline__ uint64_t wgmma_desc_k128(uint32_t smem_addr) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t(16 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// Descriptor of an MN-major bf16 tile (the B operand of a wgmma with imm-trans-b = 1, i.e. B[k][n]
// stored with n contiguous) whose rows, one k each, are exactly 128 bytes = 64 n, with the 128-byte
// swizzle: 16-byte unit u of row k stored at unit u ^ (k % 8), tile base 1024-byte aligned. That is
// the very bytes wgmma_desc_k128 describes (a row-major [rows][64] bf16 tile, 128-byte swizzled), read
// the other way round: here a row is one k and its 64 elements are n. For O += P V the V tile
// [keys][dims] is B with k = key, n = dim.
// PTX ISA ("Matrix Descriptor Format", "Shared Memory Matrix Layout") and CUTLASS's canonical GMMA
// layouts: an MN-major 128-byte-swizzle atom is 64 n (128 bytes) x 8 k (8 rows of 128 bytes, 1024
// bytes); the stride byte offset (bits 32-45) steps from one group of 8 k rows to the next (1024 here),
// the leading byte offset (bits 16-29) from one 64-wide n block to the next. With N = 64 there is only
// one n block, so the leading offset is never applied; it is set to 1024 as well, which makes the
// descriptor right even under the other reading of the two fields (leading = the k-group stride)
// that some texts give. Swizzle mode 1 (128 bytes) in bits 62-63, base offset 0 (atoms 1024-aligned).
// The k16 step s (rows 16 s .. 16 s + 15) starts 2048 s bytes in, on an atom boundary.
__device__ __forceinline__ uint64_t wgmma_desc_mn128(uint32_t smem_addr) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t(1024 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// Orders this thread's generic-proxy writes to shared memory (st.shared, cp.async) before later
// async-proxy reads (the wgmma's descriptor operands).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Before the first wgmma that reads registers written since the last one (accumulators, A).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous MMA
// (the wgmma writes it behind the compiler's back until wgmma_wait).
__device__ __forceinline__ void wgmma_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// D[64 x N] += A[64 x 16] (registers, bf16) * B[16 x N] (shared memory, K-major, descriptor); N = 32, 48,
// 64 or 128.
template <int kN>
__device__ __forceinline__ void wgmma_m64k16_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b_desc);

// m64n64k16 with B K-major (kTransB 0) or MN-major (1: imm-trans-b, which bf16 allows).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(kTransB)
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_m64k16_rs<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
  wgmma_m64n64k16_rs<0>(d, a, b_desc);
}

// D = A B, m64n64k16, B K-major: scale-d = 0, so d is an output only (no zeros written first, and its
// old values are not kept live up to the MMA).
__device__ __forceinline__ void wgmma_m64n64k16_rs_overwrite(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]),
        "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]),
        "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]),
        "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc)
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_m64k16_rs<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, "
      "%67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc)
      : "memory");
}

// The narrow token tiles of the MoE pipe kernels (route tiles of 16, 32 and 48 rows, decode batches of
// 5-36 rows an expert): the same A, B and D layouts with N / 8 column groups.
template <>
__device__ __forceinline__ void wgmma_m64k16_rs<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc)
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_m64k16_rs<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc)
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_m64k16_rs<48>(float (&d)[24], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, "
      "{%24, %25, %26, %27}, %28, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc)
      : "memory");
}

// D[64 x N] += A[64 x 16] (registers, bf16) * B[16 x N] (shared memory, MN-major: the descriptor is
// wgmma_desc_mn128's, imm-trans-b = 1, which bf16 allows); N = 64. Same A and D layouts as above.
template <int kN>
__device__ __forceinline__ void wgmma_m64k16_rs_tb(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b_desc);

template <>
__device__ __forceinline__ void wgmma_m64k16_rs_tb<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
  wgmma_m64n64k16_rs<1>(d, a, b_desc);
}

// D[64 x N] (+)= A[64 x 32] (registers, e4m3) * B[32 x N] (shared memory, e4m3, K-major: e4m3 takes no
// transpose) with f32 accumulation; accumulate = false overwrites D (scale-d 0). The A fragment of an
// 8-bit type is mma.m16n8k32's per warp (CUTLASS's ALayout_64x32): a[0] = A[16w + g][4c ..],
// a[1] = A[16w + g + 8][4c ..], a[2] = A[16w + g][16 + 4c ..], a[3] = A[16w + g + 8][16 + 4c ..];
// D as above. A K-major e4m3 row of 128 codes is 128 bytes, so wgmma_desc_k128 describes B, and the
// k32 step s starts 32 s bytes in. N = 64 or 128.
template <int kN>
__device__ __forceinline__ void wgmma_m64k32_e4m3_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b_desc,
                                                     bool accumulate);

template <>
__device__ __forceinline__ void wgmma_m64k32_e4m3_rs<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc,
                                                         bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate))
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_m64k32_e4m3_rs<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc,
                                                          bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, "
      "%67}, %68, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate))
      : "memory");
}

}  // namespace ossrt::cuda
