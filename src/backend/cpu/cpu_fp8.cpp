#include "backend/cpu/cpu_fp8.h"

#include <algorithm>

#include "core/error.h"
#include "core/fp8.h"

namespace ossrt::cpu {

bool quantizes_dense_weights(WeightFormat format) {
  return format == WeightFormat::Fp8 || format == WeightFormat::Mxfp4Fp8;
}

bool quantizes_expert_weights(WeightFormat format) { return format == WeightFormat::Fp8; }

void upload_fp8_parts(ThreadPool& pool, std::span<const HostTensor* const> parts, float* dst) {
  for (const HostTensor* p : parts) {
    OSSRT_CHECK(p->shape.size() == 2, "upload_linear: '{}' has {} dimensions, expected a matrix [out, in]", p->name,
                p->shape.size());
    const int64_t rows = p->shape[0], cols = p->shape[1];
    p->to_f32(0, p->numel(), dst);
    // Bands of 128 rows are independent blocks: one task each.
    const int64_t bands = (rows + kFp8BlockSize - 1) / kFp8BlockSize;
    pool.parallel_for(bands, [&](int64_t b, int64_t e) {
      for (int64_t band = b; band < e; ++band) {
        const int64_t r0 = band * kFp8BlockSize;
        fp8_quantize_blocks_inplace(dst + r0 * cols, std::min(kFp8BlockSize, rows - r0), cols);
      }
    });
    dst += p->numel();
  }
}

void fp8_quantize_experts_inplace(ThreadPool& pool, float* w, int64_t experts, int64_t out, int64_t in, float* scales) {
  const int64_t scales_per_expert =
      ((out + kFp8BlockSize - 1) / kFp8BlockSize) * ((in + kFp8BlockSize - 1) / kFp8BlockSize);
  pool.parallel_for(experts, [&](int64_t b, int64_t e) {
    for (int64_t expert = b; expert < e; ++expert)
      fp8_quantize_blocks_inplace(w + expert * out * in, out, in, scales + expert * scales_per_expert);
  });
}

void fp8_quantize_activations(ThreadPool& pool, const float* x, int64_t rows, int64_t n, float* out) {
  pool.parallel_for(rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      std::copy_n(x + r * n, n, out + r * n);
      fp8_quantize_row_inplace(out + r * n, n);
    }
  });
}

}  // namespace ossrt::cpu
