#include "backend/cuda/step_timing.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"

namespace ossrt::cuda {

bool StepTimer::enabled_by_environment() {
  const char* v = std::getenv("OSSRT_CUDA_STEP_TIMING");
  return v && v[0] != '\0' && v[0] != '0';
}

StepTimer::StepTimer(CUstream_st* stream) : stream_(stream) {
  OSSRT_CUDA_CHECK(cudaEventCreate(&begin_));
  OSSRT_CUDA_CHECK(cudaEventCreate(&forward_));
  OSSRT_CUDA_CHECK(cudaEventCreate(&sampled_));
}

StepTimer::~StepTimer() {
  for (const auto& [shape, s] : sums_) {
    if (s.steps == 0) continue;
    const double n = s.steps;
    const auto [batch, tokens] = shape;
    spdlog::info(
        "step timing, batch {}: {} {} steps, period {:.1f} us; GPU stream {:.1f} us (forward {:.1f}, "
        "sampler {:.1f}); host enqueue {:.1f} us, between steps {:.1f} us; stream idle {:.1f}% of the period",
        batch, s.steps, tokens == 1 ? std::string("decode") : fmt::format("verify (1 + {} tokens)", tokens - 1),
        s.period_us / n, s.stream_us / n, s.forward_us / n, (s.stream_us - s.forward_us) / n, s.enqueue_us / n,
        s.between_us / n, 100.0 * (1.0 - s.stream_us / s.period_us));
  }
  for (CUevent_st* e : {begin_, forward_, sampled_})
    if (e) cudaEventDestroy(e);
}

void StepTimer::close_previous(Clock::time_point now) {
  // Counted only when the previous step was a decode or verify step and went through the sampler.
  if (batch_ > 0 && have_forward_ && have_sample_ && synced_) {
    Sums& s = sums_[{batch_, seq_tokens_}];
    ++s.steps;
    s.period_us += std::chrono::duration<double, std::micro>(now - host_begin_).count();
    s.stream_us += 1000.0 * stream_ms_;
    s.forward_us += 1000.0 * forward_ms_;
    s.enqueue_us += std::chrono::duration<double, std::micro>(host_forward_ - host_begin_).count();
    s.between_us += std::chrono::duration<double, std::micro>(now - host_synced_).count();
  }
  batch_ = 0;
  have_forward_ = have_sample_ = synced_ = false;
}

void StepTimer::step_begin(int num_seqs, int seq_tokens) {
  const Clock::time_point now = Clock::now();
  close_previous(now);
  batch_ = seq_tokens > 0 ? num_seqs : 0;
  seq_tokens_ = seq_tokens;
  host_begin_ = now;
  OSSRT_CUDA_CHECK(cudaEventRecord(begin_, stream_));
}

void StepTimer::forward_enqueued() {
  if (have_forward_) return;  // the first forward of the step (a verify step samples once)
  host_forward_ = Clock::now();
  have_forward_ = true;
  OSSRT_CUDA_CHECK(cudaEventRecord(forward_, stream_));
}

void StepTimer::sampler_enqueued() {
  if (!have_forward_ || have_sample_) return;
  have_sample_ = true;
  OSSRT_CUDA_CHECK(cudaEventRecord(sampled_, stream_));
}

void StepTimer::sampler_synced() {
  if (!have_sample_ || synced_) return;
  host_synced_ = Clock::now();
  synced_ = true;
  // The stream was synchronized after the sampler event: both elapsed times are ready.
  OSSRT_CUDA_CHECK(cudaEventElapsedTime(&stream_ms_, begin_, sampled_));
  OSSRT_CUDA_CHECK(cudaEventElapsedTime(&forward_ms_, begin_, forward_));
}

}  // namespace ossrt::cuda
