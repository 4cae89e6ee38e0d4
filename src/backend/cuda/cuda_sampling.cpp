// CudaBackend::sample: the GPU sampler entry point. Parameters and token masks go up in one copy,
// one kernel samples every row, only the ids come back.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/sample.cuh"
#include "backend/cuda/step_timing.h"

namespace ossrt {

static_assert(sizeof(SamplingRowParams) == sizeof(cuda::SampleRowParams), "sampling params layout");
static_assert(offsetof(SamplingRowParams, mask_slot) == offsetof(cuda::SampleRowParams, mask_slot),
              "sampling params layout");
// The masks follow the row parameters in the upload: each row's 32 bytes keep them word-aligned.
static_assert(sizeof(SamplingRowParams) % sizeof(uint32_t) == 0, "sampling upload alignment");

std::vector<int32_t> CudaBackend::sample(const Tensor& logits, std::span<const SamplingRowParams> params,
                                         std::span<const std::span<const uint32_t>> allowed) {
  bind_device();
  OSSRT_CHECK(logits.device == Device::CUDA && logits.dtype == DType::F32 && logits.ndim == 2,
              "sample: logits must be an F32 [R, V] CUDA tensor, got {} {}", dtype_name(logits.dtype),
              logits.shape_str());
  const int64_t rows = logits.dim(0);
  OSSRT_CHECK(int64_t(params.size()) == rows, "sample: {} parameter rows for {} logit rows", params.size(), rows);
  OSSRT_CHECK(allowed.empty() || allowed.size() == params.size(), "sample: {} masks for {} rows", allowed.size(),
              params.size());
  OSSRT_CHECK(rows <= max_sample_rows_, "sample: {} rows exceed the planned {}", rows, max_sample_rows_);
  const int64_t vocab = logits.dim(1);
  OSSRT_CHECK(vocab >= 1 && vocab < (int64_t(1) << 31), "sample: vocab {}", vocab);
  for (const auto& p : params) {
    OSSRT_CHECK(std::isfinite(p.temperature) && p.top_k >= 0 && p.top_p > 0.f && p.top_p <= 1.f,
                "sample: invalid parameters (temperature {}, top_k {}, top_p {})", p.temperature, p.top_k, p.top_p);
  }
  const size_t words = size_t(vocab + 31) / 32;
  size_t masked = 0;
  for (const auto& m : allowed) masked += m.empty() ? 0 : 1;
  OSSRT_CHECK(masked * words <= sample_mask_words_,
              "sample: {} masked rows of vocab {} exceed the planned mask room ({} words)", masked, vocab,
              sample_mask_words_);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  if (rows == 0) return ids;

  // Stage [params | masks] in pinned memory. Reusing the staging is safe: the previous call's copy
  // finished before its final synchronize.
  const size_t params_bytes = params.size_bytes();
  auto* staged = reinterpret_cast<SamplingRowParams*>(sample_staging_);
  std::memcpy(staged, params.data(), params_bytes);
  auto* staged_masks = reinterpret_cast<uint32_t*>(sample_staging_ + params_bytes);
  int32_t slot = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    staged[i].mask_slot = -1;
    if (allowed.empty() || allowed[i].empty()) continue;
    // Exactly `words` words: a shorter mask allows nothing past its end (the host Sampler's rule),
    // a longer one only adds bits past the vocabulary, which nothing reads.
    uint32_t* dst = staged_masks + size_t(slot) * words;
    const size_t n = std::min(words, allowed[i].size());
    std::memcpy(dst, allowed[i].data(), n * sizeof(uint32_t));
    std::fill(dst + n, dst + words, 0u);
    staged[i].mask_slot = slot++;
  }
  const size_t upload_bytes = params_bytes + size_t(slot) * words * sizeof(uint32_t);
  OSSRT_CUDA_CHECK(cudaMemcpyAsync(sample_upload_, sample_staging_, upload_bytes, cudaMemcpyHostToDevice, stream_));
  const char* device_upload = static_cast<const char*>(sample_upload_);
  cuda::SampleArgs a{logits.ptr<float>(),
                     reinterpret_cast<const cuda::SampleRowParams*>(device_upload),
                     reinterpret_cast<const uint32_t*>(device_upload + params_bytes),
                     static_cast<int32_t*>(sample_ids_),
                     int(rows),
                     int(vocab),
                     int(words),
                     static_cast<cuda::SampleArgmaxPartial*>(sample_workspace_)};
  OSSRT_CUDA_CHECK(cuda::launch_f32_sample_topk_topp(a, stream_));
  if (step_timer_) step_timer_->sampler_enqueued();
  OSSRT_CUDA_CHECK(
      cudaMemcpyAsync(ids.data(), sample_ids_, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (step_timer_) step_timer_->sampler_synced();
  return ids;
}

bool CudaBackend::sample_on_device(const Tensor& logits, std::span<const DeviceSamplingRow> rows,
                                   std::span<int32_t> out) {
  bind_device();
  OSSRT_CHECK(out.size() == rows.size(), "sample_on_device: {} output slots for {} rows", out.size(), rows.size());
  // Greedy unmasked rows of the logits the unembedding just made: their argmax is already on the
  // device (unembed's fused argmax, the sampler's greedy rule bit for bit), so only the ids come back.
  const bool ours = fused_greedy_.logits != nullptr && logits.data == fused_greedy_.logits && logits.ndim == 2 &&
                    logits.dim(0) == int64_t(rows.size()) && logits.dim(0) <= fused_greedy_.rows &&
                    logits.dim(1) == fused_greedy_.vocab;
  const bool all_greedy = std::all_of(
      rows.begin(), rows.end(), [](const DeviceSamplingRow& r) { return r.temperature == 0.f && r.allowed.empty(); });
  OSSRT_CHECK(!ours || fused_greedy_.logits_written || all_greedy,
              "sample_on_device: the step was planned greedy-only (StepPlan::greedy_ids_only), so its logits were "
              "not computed, but a row wants more than its argmax");
  if (ours && all_greedy && !rows.empty()) {
    if (step_timer_) step_timer_->sampler_enqueued();
    OSSRT_CUDA_CHECK(
        cudaMemcpyAsync(out.data(), greedy_ids_, out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (step_timer_) step_timer_->sampler_synced();
    for (const int32_t id : out)
      OSSRT_CHECK(id >= 0 && id < fused_greedy_.vocab, "sample_on_device: the fused greedy argmax gave id {} of {}", id,
                  fused_greedy_.vocab);
    ++fused_greedy_samples_;
    if (fused_greedy_.replayed) ++fused_greedy_replay_samples_;
    return true;
  }
  // Masks have room for one row per planned sequence (the constructor's plan); a step with more
  // masked rows (constrained requests speculating: a mask per verify row) samples on the host.
  const size_t words = size_t(logits.ndim == 2 ? logits.dim(1) + 31 : 0) / 32;
  const size_t masked =
      size_t(std::count_if(rows.begin(), rows.end(), [](const DeviceSamplingRow& r) { return !r.allowed.empty(); }));
  if (masked * words > sample_mask_words_) return false;
  std::vector<SamplingRowParams> params(rows.size());
  std::vector<std::span<const uint32_t>> allowed(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const DeviceSamplingRow& r = rows[i];
    SamplingRowParams& p = params[i];
    p.temperature = r.temperature;
    p.top_k = r.top_k;
    p.top_p = r.top_p;
    p.seed_lo = uint32_t(r.seed);
    p.seed_hi = uint32_t(r.seed >> 32);
    p.offset = r.draw_index;
    allowed[i] = r.allowed;
  }
  const std::vector<int32_t> ids = sample(logits, params, allowed);
  std::copy(ids.begin(), ids.end(), out.begin());
  return true;
}

}  // namespace ossrt
