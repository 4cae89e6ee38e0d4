// bf16_gemv (gemv.cuh): a 256-thread CTA of 8 warps owns 8 / kWarpsPerRow output rows
// (gemv_common.cuh: how a row's dot products are split and summed). One warp per row when there are
// enough rows to fill the GPU (QKV, O, unembedding); a whole CTA per row when there are few.
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/gemv.cuh"
#include "backend/cuda/kernels/gemv_common.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <int kM, int kWarpsPerRow>
__global__ void __launch_bounds__(kThreads) bf16_gemv(GemvArgs a) {
  constexpr int kRowsPerCta = kWarps / kWarpsPerRow;
  const int row = blockIdx.x * kRowsPerCta + int(threadIdx.x / 32) / kWarpsPerRow;
  const bool row_ok = row < a.n;
  float acc[kM];
  if (!gemv_row_dot<kM, kWarpsPerRow, kWarps>(a.x, a.w + int64_t(row_ok ? row : 0) * a.k, row_ok, a.k, a.m, acc))
    return;
  const float bias = a.bias ? bf16_bits_to_float(a.bias[row]) : 0.f;
#pragma unroll
  for (int r = 0; r < kM; ++r) {
    if (r >= a.m) break;
    const float y = acc[r] + bias;
    if (a.out_f32)
      static_cast<float*>(a.out)[int64_t(r) * a.n + row] = y;
    else
      reinterpret_cast<__nv_bfloat16*>(a.out)[int64_t(r) * a.n + row] = __float2bfloat16_rn(y);
  }
}

using GemvKernel = void (*)(GemvArgs);

template <int kWarpsPerRow>
GemvKernel pick_rows(int m) {
  if (m == 1) return bf16_gemv<1, kWarpsPerRow>;
  if (m == 2) return bf16_gemv<2, kWarpsPerRow>;
  if (m <= 4) return bf16_gemv<4, kWarpsPerRow>;
  return bf16_gemv<8, kWarpsPerRow>;
}

}  // namespace

bool gemv_supported(const GemvArgs& a) {
  return a.m >= 1 && a.m <= kGemvMaxRows && a.n >= 1 && a.k >= 8 && a.k % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
}

void launch_bf16_gemv(const GemvArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(gemv_supported(a), "bf16_gemv: m ", a.m, " n ", a.n, " k ", a.k,
                 " (m 1..8, k a multiple of 8, 16-byte aligned x and w)");
  int device = 0, sms = 0;
  OSSRT_CUDA_CALL(cudaGetDevice(&device));
  OSSRT_CUDA_CALL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // A warp per row needs n / 8 CTAs to cover the SMs a few times over; with fewer rows (the router)
  // every warp of a CTA takes a slice of one row's K.
  const bool few_rows = (a.n + kWarps - 1) / kWarps < 2 * sms;
  const GemvKernel kernel = few_rows ? pick_rows<kWarps>(a.m) : pick_rows<1>(a.m);
  const int rows_per_cta = few_rows ? 1 : kWarps;
  const dim3 grid((a.n + rows_per_cta - 1) / rows_per_cta);
  OSSRT_CUDA_CALL(launch_pdl(kernel, grid, dim3(kThreads), stream, a));
}

}  // namespace ossrt::cuda
