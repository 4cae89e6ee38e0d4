#pragma once
// Where each row of a step is sampled: on the backend's device sampler (Backend::sample_on_device,
// only ids cross to the host) or by the host Sampler (the logits row is copied first).
//
// The choice is made PER ROW from the request's own parameters and its own progress (the row's
// output position: tokens generated so far, plus the guesses before a verify row), never from the
// rest of the batch. That keeps a request's n-th draw a pure function of (seed, n) however it is
// batched, preempted or speculated: a seeded request beside a logprobs request draws from the same
// generator it would draw from alone. (Falling back to the host for the whole step whenever one row
// needs it would make a seeded request's tokens depend on its neighbours, because the device and
// host samplers draw different streams for the same seed.)
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "sampling/sampler.h"

namespace ossrt {

// The device sampler's row for `row`, or nullopt when it needs what only the host sampler does:
// logprobs, logit_bias, repetition/frequency/presence penalties, min_p, EOS/stop suppression
// below min_tokens, or a non-finite temperature. Greedy rows (temperature below the sampler's
// greedy threshold) map to temperature 0, whose argmax (lowest id on ties) equals the host's.
// A token constraint's mask goes along (DeviceSamplingRow::allowed views row.allowed): whether a
// row is masked is its own property too, so the per-row rule above still holds.
std::optional<DeviceSamplingRow> device_sampling_row(const SamplingRow& row);

// True when the device sampler takes `row` as plain greedy (temperature 0, no token mask): all it
// needs is the argmax, so a step whose logit rows are all such rows may leave its logits unwritten
// (StepPlan::greedy_ids_only).
bool only_greedy_ids(const SamplingRow& row);

struct StepSamplingCounters {
  uint64_t device_rows = 0;   // rows sampled by the device sampler
  uint64_t host_rows = 0;     // rows sampled on the host
  uint64_t device_calls = 0;  // sample_on_device calls that returned true
};

class StepSampler {
 public:
  // One token per row; logits: F32 [rows.size(), vocab] on `backend` (as run_step returned it).
  // Rows the device sampler can serve are sampled there (one call for the whole step; rows it
  // cannot serve ride along as greedy and are overwritten); the others copy their own logits row
  // to the host and go through the host Sampler.
  std::vector<SampledToken> sample(Backend& backend, const Tensor& logits, int64_t vocab,
                                   std::span<const SamplingRow> rows);

  const StepSamplingCounters& counters() const { return counters_; }

 private:
  Sampler host_;
  StepSamplingCounters counters_;
};

}  // namespace ossrt
