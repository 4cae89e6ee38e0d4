// CudaBackend::sample: the GPU sampler entry point. Parameters go up, one kernel samples every row,
// only the ids come back.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/sample.cuh"

namespace ossrt {

static_assert(sizeof(SamplingRowParams) == sizeof(cuda::SampleRowParams), "sampling params layout");

std::vector<int32_t> CudaBackend::sample(const Tensor& logits, std::span<const SamplingRowParams> params) {
  bind_device();
  OSSRT_CHECK(logits.device == Device::CUDA && logits.dtype == DType::F32 && logits.ndim == 2,
              "sample: logits must be an F32 [R, V] CUDA tensor, got {} {}", dtype_name(logits.dtype),
              logits.shape_str());
  const int64_t rows = logits.dim(0);
  OSSRT_CHECK(int64_t(params.size()) == rows, "sample: {} parameter rows for {} logit rows", params.size(), rows);
  OSSRT_CHECK(rows <= max_sample_rows_, "sample: {} rows exceed the planned {}", rows, max_sample_rows_);
  OSSRT_CHECK(logits.dim(1) >= 1 && logits.dim(1) < (int64_t(1) << 31), "sample: vocab {}", logits.dim(1));
  for (const auto& p : params) {
    OSSRT_CHECK(std::isfinite(p.temperature) && p.top_k >= 0 && p.top_p > 0.f && p.top_p <= 1.f,
                "sample: invalid parameters (temperature {}, top_k {}, top_p {})", p.temperature, p.top_k, p.top_p);
  }
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  if (rows == 0) return ids;
  OSSRT_CUDA_CHECK(cudaMemcpyAsync(sample_params_, params.data(), params.size_bytes(), cudaMemcpyHostToDevice, stream_));
  cuda::SampleArgs a{logits.ptr<float>(), static_cast<const cuda::SampleRowParams*>(sample_params_),
                     static_cast<int32_t*>(sample_ids_), int(rows), int(logits.dim(1))};
  OSSRT_CUDA_CHECK(cuda::launch_f32_sample_topk_topp(a, stream_));
  OSSRT_CUDA_CHECK(cudaMemcpyAsync(ids.data(), sample_ids_, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ids;
}

bool CudaBackend::sample_on_device(const Tensor& logits, std::span<const DeviceSamplingRow> rows,
                                   std::span<int32_t> out) {
  bind_device();
  OSSRT_CHECK(out.size() == rows.size(), "sample_on_device: {} output slots for {} rows", out.size(), rows.size());
  std::vector<SamplingRowParams> params(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const DeviceSamplingRow& r = rows[i];
    SamplingRowParams& p = params[i];
    p.temperature = r.temperature;
    p.top_k = r.top_k;
    p.top_p = r.top_p;
    p.seed_lo = uint32_t(r.seed);
    p.seed_hi = uint32_t(r.seed >> 32);
    p.offset = r.draw_index;
  }
  const std::vector<int32_t> ids = sample(logits, params);
  std::copy(ids.begin(), ids.end(), out.begin());
  return true;
}

}  // namespace ossrt
