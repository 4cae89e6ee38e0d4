#include "engine/step_sampling.h"

#include <cmath>

#include "core/error.h"

namespace ossrt {

std::optional<DeviceSamplingRow> device_sampling_row(const SamplingRow& row) {
  const SamplingParams& p = *row.params;
  const SamplingState& state = *row.state;
  // What changes the logits before the choice, or what the caller wants besides the id, is host-only;
  // a token constraint's mask is the exception: the device sampler applies it (DeviceSamplingRow::allowed).
  if (p.logprobs >= 0 || !p.logit_bias.empty()) return std::nullopt;
  if (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) return std::nullopt;
  if (row.position() < p.min_tokens && !row.suppressed_ids.empty()) return std::nullopt;

  DeviceSamplingRow d;
  d.seed = state.seed();
  d.draw_index = uint32_t(row.position());  // < max_model_len, far below 2^32
  d.allowed = row.allowed;
  // Greedy ignores min_p, top_k and top_p on the host as well.
  if (p.temperature < kGreedyTemperature) return d;
  if (!std::isfinite(p.temperature) || p.min_p > 0.0f) return std::nullopt;
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return std::nullopt;  // validated at submit; never hand it on
  d.temperature = p.temperature;
  d.top_k = p.top_k > 0 ? p.top_k : 0;  // the host's -1 and 0 both mean "off"
  d.top_p = p.top_p;
  return d;
}

bool only_greedy_ids(const SamplingRow& row) {
  const std::optional<DeviceSamplingRow> d = device_sampling_row(row);
  return d && d->temperature == 0.0f && d->allowed.empty();
}

std::vector<SampledToken> StepSampler::sample(Backend& backend, const Tensor& logits, int64_t vocab,
                                              std::span<const SamplingRow> rows) {
  OSSRT_CHECK(logits.ndim == 2 && logits.dim(0) == int64_t(rows.size()) && logits.dim(1) == vocab,
              "step sampler: logits {} for {} rows of vocab {}", logits.shape_str(), rows.size(), vocab);
  std::vector<SampledToken> out(rows.size());
  std::vector<DeviceSamplingRow> device_rows(rows.size());  // host-only rows ride along as greedy
  std::vector<size_t> host_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (std::optional<DeviceSamplingRow> d = device_sampling_row(rows[i]))
      device_rows[i] = *d;
    else
      host_rows.push_back(i);
  }

  bool sampled_on_device = false;
  if (host_rows.size() < rows.size()) {
    std::vector<int32_t> ids(rows.size());
    sampled_on_device = backend.sample_on_device(logits, device_rows, ids);
    if (sampled_on_device) {
      ++counters_.device_calls;
      for (size_t i = 0; i < ids.size(); ++i) {
        OSSRT_CHECK(ids[i] >= 0 && ids[i] < vocab, "device sampler returned token {} for row {} (vocab {})", ids[i], i,
                    vocab);
        out[i].id = ids[i];
      }
      counters_.device_rows += rows.size() - host_rows.size();
    }
  }
  if (!sampled_on_device) {
    // No device sampler, or no row it can serve: one copy of every row, as the host sampler needs.
    const std::vector<float> host_logits = backend.to_host_f32(logits);
    counters_.host_rows += rows.size();
    return host_.sample(host_logits, vocab, rows);
  }
  // Only the rows that need the host sampler cross to the host.
  for (size_t i : host_rows) {
    const std::vector<float> row_logits = backend.to_host_f32(logits.rows(int64_t(i), 1));
    out[i] = host_.sample_row(row_logits, rows[i]);
  }
  counters_.host_rows += host_rows.size();
  return out;
}

}  // namespace ossrt
