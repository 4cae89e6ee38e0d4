// Which sampler serves a row (engine/step_sampling.h), checked on the CPU with a backend that wraps
// the CPU oracle and adds a recording "device sampler": the row mapping for every sampling option,
// that only host-served rows cross to the host, that the host rows get exactly the host sampler's
// result, that token-constrained rows reach the device sampler with their masks, and through the
// engine: greedy equals the independent reference with zero logits copies, constrained greedy on
// the device equals the host sampler's, and a seeded request draws indices 0, 1, 2, ... of its own
// stream alone, in a mixed batch and through preemption.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "engine/step_sampling.h"
#include "engine_test_model.h"
#include "sampling/logits_processing.h"
#include "sampling/token_constraint.h"

namespace ossrt {
namespace {

using namespace testing_engine;

// The CPU backend plus a fake device sampler. Its draws are a Gumbel-max sample of
// softmax(logits / T) keyed by (seed, draw_index), so a wrong row, seed or index shows in the ids.
// It applies a row's mask as DeviceSamplingRow documents it (written here from that comment, not
// from the host sampler's helpers).
class RecordingDeviceSamplerBackend final : public Backend {
 public:
  explicit RecordingDeviceSamplerBackend(std::unique_ptr<Backend> inner, bool has_device_sampler = true)
      : inner_(std::move(inner)), has_device_sampler_(has_device_sampler) {}

  struct Call {
    std::vector<DeviceSamplingRow> rows;
    std::vector<int32_t> ids;
  };
  std::vector<Call> calls;
  int to_host_calls = 0;  // logits transfers the caller asked for
  int64_t rows_to_host = 0;
  bool return_out_of_range = false;

  static int32_t fake_draw(std::span<const float> raw, const DeviceSamplingRow& r) {
    std::vector<float> logits(raw.begin(), raw.end());
    if (!r.allowed.empty()) {
      bool any = false;
      for (size_t i = 0; i < logits.size(); ++i) {
        const bool ok = i / 32 < r.allowed.size() && ((r.allowed[i / 32] >> (i % 32)) & 1u);
        if (!ok) logits[i] = -INFINITY;
        any = any || ok;
      }
      if (!any) return argmax_lowest_id(raw);  // a mask that allows nothing is ignored: raw argmax
    }
    if (r.temperature <= 0.0f) return argmax_lowest_id(logits);
    int32_t best = 0;
    double best_key = -INFINITY;
    for (size_t i = 0; i < logits.size(); ++i) {
      const double u = std::max(uniform_draw(r.seed ^ 0xD1CEull, uint64_t(r.draw_index) * logits.size() + i), 1e-300);
      const double key = double(logits[i]) / r.temperature - std::log(-std::log(u));
      if (key > best_key) best_key = key, best = int32_t(i);
    }
    return best;
  }

  bool sample_on_device(const Tensor& logits, std::span<const DeviceSamplingRow> rows,
                        std::span<int32_t> out) override {
    if (!has_device_sampler_) return false;
    EXPECT_EQ(logits.dim(0), int64_t(rows.size()));
    EXPECT_EQ(out.size(), rows.size());
    const std::vector<float> host = inner_->to_host_f32(logits);  // the "device" reads its own memory
    const size_t v = size_t(logits.dim(1));
    Call call{{rows.begin(), rows.end()}, {}};
    for (size_t r = 0; r < rows.size(); ++r) {
      out[r] = return_out_of_range ? int32_t(v) : fake_draw(std::span(host).subspan(r * v, v), rows[r]);
      call.ids.push_back(out[r]);
    }
    calls.push_back(std::move(call));
    return true;
  }

  std::vector<float> to_host_f32(const Tensor& t) override {
    ++to_host_calls;
    rows_to_host += t.ndim == 2 ? t.dim(0) : 1;
    return inner_->to_host_f32(t);
  }

  // ---- everything else is the CPU oracle's
  std::string name() const override { return "recording-" + inner_->name(); }
  Device device() const override { return inner_->device(); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  DType residual_dtype() const override { return inner_->residual_dtype(); }
  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) override { return inner_->alloc(dtype, shape); }
  void to_host(const Tensor& t, void* dst) override { inner_->to_host(t, dst); }
  void from_host(Tensor& t, const void* src) override { inner_->from_host(t, src); }
  void sync() override { inner_->sync(); }
  Tensor upload(const HostTensor& src) override { return inner_->upload(src); }
  Tensor upload_concat_rows(std::span<const HostTensor* const> parts) override {
    return inner_->upload_concat_rows(parts);
  }
  Tensor upload_linear(std::span<const HostTensor* const> parts) override { return inner_->upload_linear(parts); }
  ExpertWeights upload_experts(const HostExperts& gate_up, const HostExperts& down) override {
    return inner_->upload_experts(gate_up, down);
  }
  void allocate_kv_cache(const KvCacheShape& shape) override { inner_->allocate_kv_cache(shape); }
  size_t kv_block_bytes(const KvCacheShape& shape) const override { return inner_->kv_block_bytes(shape); }
  MemoryUse memory_use() const override { return inner_->memory_use(); }
  // Each step's plan: whether the engine marked it greedy-only, and its logit rows.
  struct PlanSeen {
    bool greedy_ids_only;
    size_t logit_rows;
  };
  std::vector<PlanSeen> plans;
  void begin_step(const StepPlan& plan) override {
    plans.push_back({plan.greedy_ids_only, plan.logit_rows.size()});
    inner_->begin_step(plan);
  }
  void embedding(const Tensor& table, Tensor& out) override { inner_->embedding(table, out); }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override { inner_->rmsnorm(x, w, eps, out); }
  void add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& w, float eps, Tensor& out) override {
    inner_->add_rmsnorm(residual, delta, w, eps, out);
  }
  void add(Tensor& residual, const Tensor& delta) override { inner_->add(residual, delta); }
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    inner_->linear(x, w, bias, out);
  }
  void rope_and_cache_write(Tensor& qkv, const RopeParams& rope, const AttentionParams& params) override {
    inner_->rope_and_cache_write(qkv, rope, params);
  }
  void attention(const Tensor& qkv, const Tensor& sinks, const AttentionParams& params, Tensor& out) override {
    inner_->attention(qkv, sinks, params, out);
  }
  void router_topk(const Tensor& x, const Tensor& w, const Tensor& b, int k, Tensor& ids, Tensor& weights) override {
    inner_->router_topk(x, w, b, k, ids, weights);
  }
  void moe(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
           const SwigluParams& swiglu, Tensor& out) override {
    inner_->moe(x, experts, ids, weights, swiglu, out);
  }
  void gather_logit_rows(const Tensor& x, Tensor& out) override { inner_->gather_logit_rows(x, out); }

 private:
  std::unique_ptr<Backend> inner_;
  bool has_device_sampler_;
};

std::unique_ptr<RecordingDeviceSamplerBackend> recording_backend(bool has_device_sampler = true) {
  return std::make_unique<RecordingDeviceSamplerBackend>(make_cpu_backend(BackendOptions{.threads = 2}),
                                                         has_device_sampler);
}

// ---------------------------------------------------------------- the row mapping

struct RowFixture {
  SamplingParams params;
  std::vector<int32_t> suppressed;
  std::vector<uint32_t> allowed;
  int generated = 0;
  uint64_t seed = 0x1234'5678'9abc'def0ull;

  std::optional<DeviceSamplingRow> map() const {
    SamplingState state(seed, std::vector<int32_t>{1, 2, 3}, params);
    for (int i = 0; i < generated; ++i) state.observe(7);
    return device_sampling_row(SamplingRow{&params, &state, suppressed, allowed, {}});
  }
};

TEST(DeviceSamplingRow, GreedyRowsMapToTemperatureZeroWithTheirSeedAndDrawIndex) {
  RowFixture f;
  f.params.temperature = 0.0f;
  f.params.top_k = 5;  // ignored by greedy, on the host too
  f.params.min_p = 0.3f;
  f.generated = 4;
  const auto d = f.map();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->temperature, 0.0f);
  EXPECT_EQ(d->top_k, 0);
  EXPECT_EQ(d->top_p, 1.0f);
  EXPECT_EQ(d->seed, f.seed);
  EXPECT_EQ(d->draw_index, 4u);

  f.params.temperature = 5e-6f;  // below the host's greedy threshold (1e-5): greedy on both
  ASSERT_TRUE(f.map().has_value());
  EXPECT_EQ(f.map()->temperature, 0.0f);
}

TEST(DeviceSamplingRow, TemperatureTopKTopPAreHandedOn) {
  RowFixture f;
  f.params.temperature = 0.7f;
  f.params.top_k = -1;  // host "off"
  f.params.top_p = 0.9f;
  f.generated = 11;
  auto d = f.map();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->temperature, 0.7f);
  EXPECT_EQ(d->top_k, 0);
  EXPECT_EQ(d->top_p, 0.9f);
  EXPECT_EQ(d->draw_index, 11u);
  f.params.top_k = 40;
  ASSERT_TRUE(f.map().has_value());
  EXPECT_EQ(f.map()->top_k, 40);
}

TEST(DeviceSamplingRow, RowsNeedingTheHostSamplerAreRefused) {
  auto refused = [](auto&& edit, const char* what) {
    for (float temperature : {0.0f, 0.8f}) {
      RowFixture f;
      f.params.temperature = temperature;
      edit(f);
      EXPECT_FALSE(f.map().has_value()) << what << " at temperature " << temperature;
    }
  };
  refused([](RowFixture& f) { f.params.logprobs = 0; }, "logprobs of the sampled token");
  refused([](RowFixture& f) { f.params.logprobs = 5; }, "top logprobs");
  refused([](RowFixture& f) { f.params.logit_bias[3] = 1.5f; }, "logit_bias");
  refused([](RowFixture& f) { f.params.repetition_penalty = 1.1f; }, "repetition penalty");
  refused([](RowFixture& f) { f.params.frequency_penalty = 0.5f; }, "frequency penalty");
  refused([](RowFixture& f) { f.params.presence_penalty = -0.5f; }, "presence penalty");
  refused([](RowFixture& f) { f.params.min_tokens = 3, f.suppressed = {9}, f.generated = 2; }, "below min_tokens");

  RowFixture min_p;
  min_p.params.temperature = 1.0f;
  min_p.params.min_p = 0.05f;
  EXPECT_FALSE(min_p.map().has_value()) << "min_p when sampling";
  RowFixture inf_t;
  inf_t.params.temperature = INFINITY;
  EXPECT_FALSE(inf_t.map().has_value()) << "non-finite temperature";
}

TEST(DeviceSamplingRow, AMaskedRowCarriesItsMaskToTheDevice) {
  for (float temperature : {0.0f, 0.8f}) {
    RowFixture f;
    f.params.temperature = temperature;
    f.params.top_k = 7;
    f.generated = 3;
    f.allowed = {0x1u, 0x0u, 0x80000000u, 0x5u};
    const auto d = f.map();
    ASSERT_TRUE(d.has_value()) << "temperature " << temperature;
    EXPECT_EQ(d->allowed.data(), f.allowed.data()) << "a view of the row's own mask, not a copy";
    EXPECT_EQ(d->allowed.size(), f.allowed.size());
    EXPECT_EQ(d->draw_index, 3u);
    EXPECT_EQ(d->top_k, temperature > 0 ? 7 : 0);
    f.allowed.clear();
    ASSERT_TRUE(f.map().has_value());
    EXPECT_TRUE(f.map()->allowed.empty()) << "unconstrained rows stay unmasked";
  }
  // A mask does not make the host-only reasons go away.
  RowFixture f;
  f.allowed = {0xFFu};
  f.params.logprobs = 2;
  EXPECT_FALSE(f.map().has_value()) << "masked + logprobs";
  f.params.logprobs = -1;
  f.params.logit_bias[1] = 2.0f;
  EXPECT_FALSE(f.map().has_value()) << "masked + logit_bias";
  f.params.logit_bias.clear();
  f.params.min_tokens = 2, f.suppressed = {9};
  EXPECT_FALSE(f.map().has_value()) << "masked + below min_tokens";
}

TEST(DeviceSamplingRow, MinTokensOnlyMattersWhileStopIdsAreSuppressed) {
  RowFixture f;
  f.params.min_tokens = 3;
  f.suppressed = {9, 511};
  for (int generated = 0; generated < 5; ++generated) {
    f.generated = generated;
    EXPECT_EQ(f.map().has_value(), generated >= 3) << generated << " tokens generated";
  }
  f.suppressed.clear();  // nothing to suppress (ignore_eos, no stop ids): the device can serve it
  f.generated = 0;
  EXPECT_TRUE(f.map().has_value());
}

// ---------------------------------------------------------------- StepSampler on hand-made logits

struct StepFixture {
  static constexpr int64_t kVocab = 97;
  std::unique_ptr<RecordingDeviceSamplerBackend> backend;
  std::vector<float> host_logits;
  Tensor logits;
  std::vector<SamplingParams> params;
  std::vector<SamplingState> states;
  std::vector<std::vector<int32_t>> suppressed;

  StepFixture(std::vector<SamplingParams> p, bool has_device_sampler = true)
      : backend(recording_backend(has_device_sampler)), params(std::move(p)) {
    std::mt19937_64 rng(17);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    host_logits.resize(params.size() * size_t(kVocab));
    for (float& x : host_logits) x = dist(rng);
    if (params.size() > 0) {  // a tie at the top of row 0: greedy must pick the lower id on both paths
      const auto row0 = std::span(host_logits).subspan(0, size_t(kVocab));
      const float top = *std::max_element(row0.begin(), row0.end());
      host_logits[40] = host_logits[12] = top + 1.0f;
    }
    logits = backend->alloc(DType::F32, {int64_t(params.size()), kVocab});
    backend->from_host(logits, host_logits.data());
    for (size_t i = 0; i < params.size(); ++i) {
      states.emplace_back(1000 + i, std::vector<int32_t>{4, 5}, params[i]);
      suppressed.push_back({3});
    }
  }
  std::vector<SamplingRow> rows() const {
    std::vector<SamplingRow> r;
    for (size_t i = 0; i < params.size(); ++i) r.push_back(SamplingRow{&params[i], &states[i], suppressed[i], {}, {}});
    return r;
  }
  std::span<const float> row_logits(size_t i) const {
    return std::span(host_logits).subspan(i * size_t(kVocab), size_t(kVocab));
  }
};

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}
SamplingParams sampled(float t, int top_k = 0, float top_p = 1.0f) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

TEST(StepSampler, DeviceServedStepsCopyNoLogitsAndGreedyIsTheLowestIdArgmax) {
  StepFixture f({greedy(), greedy(), sampled(0.8f, 20, 0.9f)});
  StepSampler sampler;
  const auto rows = f.rows();
  const auto out = sampler.sample(*f.backend, f.logits, StepFixture::kVocab, rows);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(f.backend->to_host_calls, 0) << "only ids may come back";
  ASSERT_EQ(f.backend->calls.size(), 1u);
  EXPECT_EQ(out[0].id, 12) << "tie between 12 and 40";
  for (size_t i = 0; i < 2; ++i) {
    const auto r = f.row_logits(i);
    EXPECT_EQ(out[i].id, int32_t(std::max_element(r.begin(), r.end()) - r.begin())) << "row " << i;
  }
  const DeviceSamplingRow& third = f.backend->calls[0].rows[2];
  EXPECT_EQ(third.seed, 1002u);
  EXPECT_EQ(third.draw_index, 0u);
  EXPECT_EQ(out[2].id, RecordingDeviceSamplerBackend::fake_draw(f.row_logits(2), third));
  EXPECT_FALSE(out[2].logprob.has_value());
  EXPECT_EQ(sampler.counters().device_rows, 3u);
  EXPECT_EQ(sampler.counters().host_rows, 0u);
  EXPECT_EQ(sampler.counters().device_calls, 1u);
}

std::vector<uint32_t> mask_of(std::initializer_list<int32_t> ids, int64_t vocab) {
  std::vector<uint32_t> m(size_t((vocab + 31) / 32), 0u);
  for (int32_t id : ids) m[size_t(id) / 32] |= 1u << (id % 32);
  return m;
}

TEST(StepSampler, MaskedRowsAreSampledOnTheDeviceWithTheirMasks) {
  // Row 0: the tie at the top (12 and 40) with 12 disallowed; row 1 unmasked; row 2 sampled over a
  // few scattered ids, one in the last partial word (96 of vocab 97); row 3 a mask allowing
  // nothing; row 4 masked and asking for logprobs: still the host's.
  SamplingParams with_logprobs = greedy();
  with_logprobs.logprobs = 1;
  StepFixture f({greedy(), greedy(), sampled(0.8f, 20, 0.9f), greedy(), with_logprobs});
  const int64_t v = StepFixture::kVocab;
  const std::vector<std::vector<uint32_t>> masks = {
      mask_of({3, 40, 70}, v), {}, mask_of({7, 64, 96}, v), mask_of({}, v), mask_of({5, 6}, v)};
  auto rows = f.rows();
  for (size_t i = 0; i < rows.size(); ++i) rows[i].allowed = masks[i];
  StepSampler sampler;
  const auto out = sampler.sample(*f.backend, f.logits, v, rows);

  ASSERT_EQ(f.backend->calls.size(), 1u);
  EXPECT_EQ(f.backend->to_host_calls, 1) << "only the logprobs row crosses to the host";
  const auto& device_rows = f.backend->calls[0].rows;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(device_rows[i].allowed.data(), masks[i].data()) << "row " << i;
    EXPECT_EQ(device_rows[i].allowed.size(), masks[i].size()) << "row " << i;
  }
  EXPECT_TRUE(device_rows[4].allowed.empty()) << "a host row rides along unmasked";
  EXPECT_EQ(out[0].id, 40);
  // Greedy is the same function on both samplers, masked or not: the host Sampler is the oracle.
  Sampler host;
  for (size_t i : {size_t(0), size_t(1), size_t(3), size_t(4)})
    EXPECT_EQ(out[i].id, host.sample_row(f.row_logits(i), rows[i]).id) << "row " << i;
  const auto row3 = f.row_logits(3);
  EXPECT_EQ(out[3].id, int32_t(std::max_element(row3.begin(), row3.end()) - row3.begin()))
      << "nothing allowed: the raw argmax, as on the host";
  EXPECT_TRUE(out[2].id == 7 || out[2].id == 64 || out[2].id == 96) << out[2].id;
  EXPECT_EQ(out[2].id, RecordingDeviceSamplerBackend::fake_draw(f.row_logits(2), device_rows[2]));
  EXPECT_TRUE(out[4].id == 5 || out[4].id == 6) << out[4].id;
  ASSERT_TRUE(out[4].logprob.has_value());
  EXPECT_EQ(sampler.counters().device_rows, 4u);
  EXPECT_EQ(sampler.counters().host_rows, 1u);
}

TEST(StepSampler, HostOnlyRowsCopyTheirOwnRowAndGetTheHostSamplersResult) {
  SamplingParams with_logprobs = sampled(0.9f);
  with_logprobs.logprobs = 3;
  SamplingParams penalized = greedy();
  penalized.frequency_penalty = 5.0f;
  SamplingParams below_min_tokens = sampled(1.0f);
  below_min_tokens.min_tokens = 2;
  StepFixture f({greedy(), with_logprobs, sampled(0.5f), penalized, below_min_tokens});
  // Row 3 has already produced its raw argmax once: the penalty must move its greedy choice, which
  // only the host sampler applies.
  const auto row3 = f.row_logits(3);
  const int32_t raw_argmax3 = int32_t(std::max_element(row3.begin(), row3.end()) - row3.begin());
  f.states[3].observe(raw_argmax3);
  StepSampler sampler;
  const auto rows = f.rows();
  const auto out = sampler.sample(*f.backend, f.logits, StepFixture::kVocab, rows);

  ASSERT_EQ(f.backend->calls.size(), 1u);
  EXPECT_EQ(f.backend->to_host_calls, 3) << "rows 1, 3, 4, one row each";
  EXPECT_EQ(f.backend->rows_to_host, 3);
  Sampler host;
  for (size_t i : {size_t(1), size_t(3), size_t(4)}) {
    const SampledToken want = host.sample_row(f.row_logits(i), rows[i]);
    EXPECT_EQ(out[i].id, want.id) << "host row " << i;
    EXPECT_EQ(out[i].logprob.has_value(), want.logprob.has_value()) << "host row " << i;
  }
  EXPECT_NE(out[3].id, raw_argmax3) << "the frequency penalty was applied";
  ASSERT_TRUE(out[1].logprob.has_value());
  EXPECT_EQ(out[1].logprob->top.size(), 3u);
  EXPECT_EQ(out[0].id, 12);
  EXPECT_EQ(out[2].id, RecordingDeviceSamplerBackend::fake_draw(f.row_logits(2), f.backend->calls[0].rows[2]));
  EXPECT_EQ(sampler.counters().device_rows, 2u);
  EXPECT_EQ(sampler.counters().host_rows, 3u);
}

TEST(StepSampler, WithoutADeviceSamplerOrADeviceRowEverythingIsTheHostSamplers) {
  SamplingParams with_logprobs = greedy();
  with_logprobs.logprobs = 0;
  for (bool has_device_sampler : {false, true}) {
    SCOPED_TRACE(has_device_sampler ? "no device-servable row" : "backend without a device sampler");
    std::vector<SamplingParams> params = {with_logprobs, sampled(0.7f, 5), greedy()};
    if (has_device_sampler) params = {with_logprobs, with_logprobs};
    StepFixture f(params, has_device_sampler);
    StepSampler sampler;
    const auto rows = f.rows();
    const auto out = sampler.sample(*f.backend, f.logits, StepFixture::kVocab, rows);
    const auto want = Sampler().sample(f.host_logits, StepFixture::kVocab, rows);
    ASSERT_EQ(out.size(), want.size());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].id, want[i].id) << "row " << i;
    EXPECT_TRUE(f.backend->calls.empty());
    EXPECT_EQ(f.backend->to_host_calls, 1) << "one copy of the whole step";
    EXPECT_EQ(sampler.counters().host_rows, out.size());
    EXPECT_EQ(sampler.counters().device_rows, 0u);
  }
}

TEST(StepSampler, BadDeviceIdsAndMismatchedLogitsAreErrors) {
  StepFixture f({greedy(), greedy()});
  f.backend->return_out_of_range = true;
  StepSampler sampler;
  const auto rows = f.rows();
  EXPECT_THROW(sampler.sample(*f.backend, f.logits, StepFixture::kVocab, rows), Error);
  EXPECT_THROW(sampler.sample(*f.backend, f.logits.rows(0, 1), StepFixture::kVocab, rows), Error);
  EXPECT_THROW(sampler.sample(*f.backend, f.logits, StepFixture::kVocab + 1, rows), Error);
}

// ---------------------------------------------------------------- through the engine

EngineConfig engine_config(int budget, int num_full_blocks = 512) {
  EngineConfig c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = budget;
  c.block_size = 4;
  c.num_full_blocks = num_full_blocks;
  c.start_thread = false;
  return c;
}

TEST(EngineDeviceSampling, GreedyBatchMatchesTheReferenceWithoutCopyingLogits) {
  SmallModel reference;
  SmallModel on_device(recording_backend());
  auto& backend = static_cast<RecordingDeviceSamplerBackend&>(*on_device.backend);
  Engine engine(on_device.model, engine_config(/*budget=*/29));
  EventLog log;
  int total_tokens = 0;
  for (int i = 0; i < 12; ++i) {
    const int max_tokens = 2 + (i * 5) % 9;
    total_tokens += max_tokens;
    ASSERT_TRUE(engine.submit(
        greedy_request("g" + std::to_string(i), random_prompt(1 + (i * 37) % 61, 100 + uint32_t(i)), max_tokens),
        log.callback("g" + std::to_string(i))));
  }
  engine.run_until_idle();
  for (int i = 0; i < 12; ++i) {
    const auto s = log.get("g" + std::to_string(i));
    EXPECT_EQ(s.tokens,
              reference_greedy(reference.model, random_prompt(1 + (i * 37) % 61, 100 + uint32_t(i)), 2 + (i * 5) % 9))
        << "g" << i;
  }
  EXPECT_EQ(backend.to_host_calls, 0);
  EXPECT_EQ(engine.sampling_counters().device_rows, uint64_t(total_tokens));
  EXPECT_EQ(engine.sampling_counters().host_rows, 0u);
  EXPECT_EQ(engine.kv_cache().full_pool().num_free(), engine.kv_cache().full_pool().num_blocks());
}

// Allows the ids that are multiples of `step` (the EOS, 511, only when step divides it): a mask in
// every word, set bits scattered.
class EveryNth final : public TokenConstraint {
 public:
  explicit EveryNth(int step) : step_(step) {}
  int32_t vocab_size() const override { return 512; }
  bool fill_mask(std::span<uint32_t> mask) override {
    for (int32_t id = 0; id < 512; id += step_) mask[size_t(id) / 32] |= 1u << (id % 32);
    return true;
  }
  bool accept(int32_t token) override { return token % step_ == 0; }
  void rollback(int) override {}

 private:
  int step_;
};

TEST(EngineDeviceSampling, ConstrainedGreedyRowsStayOnTheDeviceAndEqualTheHostSampler) {
  // The same batch (constrained and unconstrained greedy requests, chunked) through the recording
  // device sampler and through a backend without one (every row on the host Sampler).
  std::map<std::string, std::vector<int32_t>> tokens[2];
  for (bool has_device_sampler : {true, false}) {
    SmallModel m(recording_backend(has_device_sampler));
    auto& backend = static_cast<RecordingDeviceSamplerBackend&>(*m.backend);
    Engine engine(m.model, engine_config(/*budget=*/21));
    EventLog log;
    for (int i = 0; i < 8; ++i) {
      GenerationRequest r =
          greedy_request("c" + std::to_string(i), random_prompt(2 + (i * 13) % 30, 500 + uint32_t(i)), 7);
      if (i % 4 != 3) r.constraint = std::make_shared<EveryNth>(2 + i % 4 * 3);
      ASSERT_TRUE(engine.submit(r, log.callback(r.id)));
    }
    engine.run_until_idle();
    for (int i = 0; i < 8; ++i) {
      const auto s = log.get("c" + std::to_string(i));
      ASSERT_TRUE(s.finished);
      EXPECT_NE(s.final_event.finish_reason, FinishReason::Error) << s.final_event.error;
      EXPECT_EQ(s.tokens.size(), 7u) << "c" << i;
      if (i % 4 != 3) {
        for (int32_t t : s.tokens) EXPECT_EQ(t % (2 + i % 4 * 3), 0) << "c" << i << " sampled a disallowed " << t;
      }
      tokens[has_device_sampler ? 0 : 1]["c" + std::to_string(i)] = s.tokens;
    }
    if (has_device_sampler) {
      EXPECT_EQ(backend.to_host_calls, 0) << "masked rows no longer copy their logits";
      EXPECT_EQ(engine.sampling_counters().host_rows, 0u);
      EXPECT_EQ(engine.sampling_counters().device_rows, 8u * 7u);
      int masked_rows = 0;
      for (const auto& call : backend.calls)
        for (const auto& row : call.rows) masked_rows += row.allowed.empty() ? 0 : 1;
      EXPECT_EQ(masked_rows, 6 * 7);
    }
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

GenerationRequest seeded_request(std::string id, std::vector<int32_t> prompt, uint64_t seed, int max_tokens) {
  GenerationRequest r;
  r.id = std::move(id);
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.9f;
  r.sampling.top_k = 50;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = seed;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// The draw indices the device sampler saw for `seed`, in call order.
std::vector<uint32_t> draw_indices(const RecordingDeviceSamplerBackend& b, uint64_t seed) {
  std::vector<uint32_t> out;
  for (const auto& call : b.calls)
    for (const auto& row : call.rows)
      if (row.seed == seed && row.temperature > 0) out.push_back(row.draw_index);
  return out;
}

TEST(EngineDeviceSampling, SeededDrawsAreAPureFunctionOfSeedAndTokenIndexInAnyBatch) {
  constexpr uint64_t kSeed = 4242;
  constexpr int kTokens = 12;
  const auto prompt = random_prompt(23, 77);
  std::vector<int32_t> alone;
  {
    SmallModel m(recording_backend());
    Engine engine(m.model, engine_config(64));
    EventLog log;
    ASSERT_TRUE(engine.submit(seeded_request("s", prompt, kSeed, kTokens), log.callback("s")));
    engine.run_until_idle();
    alone = log.get("s").tokens;
    std::vector<uint32_t> want(kTokens);
    for (int i = 0; i < kTokens; ++i) want[size_t(i)] = uint32_t(i);
    EXPECT_EQ(draw_indices(static_cast<RecordingDeviceSamplerBackend&>(*m.backend), kSeed), want);
  }
  ASSERT_EQ(int(alone.size()), kTokens);

  // The same request among 15 others (greedy, other seeds, logprobs, penalties: host rows), with a
  // pool so small that sequences are preempted and recomputed.
  SmallModel m(recording_backend());
  auto& backend = static_cast<RecordingDeviceSamplerBackend&>(*m.backend);
  Engine engine(m.model, engine_config(/*budget=*/19, /*num_full_blocks=*/30));
  EventLog log;
  for (int i = 0; i < 15; ++i) {
    GenerationRequest r = i % 3 == 0
                              ? greedy_request("o" + std::to_string(i), random_prompt(5 + i * 3, 300 + uint32_t(i)), 9)
                              : seeded_request("o" + std::to_string(i), random_prompt(5 + i * 3, 300 + uint32_t(i)),
                                               7000 + uint64_t(i), 9);
    if (i % 3 == 1) r.sampling.logprobs = 2;
    if (i % 3 == 2 && i % 2 == 0) r.sampling.presence_penalty = 0.5f;
    ASSERT_TRUE(engine.submit(r, log.callback(r.id)));
    if (i == 7) {
      ASSERT_TRUE(engine.submit(seeded_request("s", prompt, kSeed, kTokens), log.callback("s")));
    }
  }
  engine.run_until_idle();
  EXPECT_GT(engine.stats().preemptions, 0u);
  EXPECT_EQ(log.get("s").tokens, alone);
  std::vector<uint32_t> want(kTokens);
  for (int i = 0; i < kTokens; ++i) want[size_t(i)] = uint32_t(i);
  EXPECT_EQ(draw_indices(backend, kSeed), want) << "each draw once, in order, through preemption";
  for (int i = 1; i < 15; i += 3) {
    const auto s = log.get("o" + std::to_string(i));
    EXPECT_EQ(s.final_event.completion_tokens, 9);
    size_t logprobs = 0;
    for (const auto& ev : s.events) logprobs += ev.logprobs.size();
    EXPECT_EQ(logprobs, 9u) << "logprobs rows are sampled on the host and keep their logprobs";
  }
  EXPECT_GT(engine.sampling_counters().host_rows, 0u);
  EXPECT_GT(engine.sampling_counters().device_rows, 0u);
  EXPECT_EQ(engine.sampling_counters().host_rows + engine.sampling_counters().device_rows, uint64_t(15 * 9 + kTokens));
  EXPECT_EQ(engine.kv_cache().full_pool().num_free(), engine.kv_cache().full_pool().num_blocks());
  EXPECT_EQ(engine.kv_cache().window_pool().num_free(), engine.kv_cache().window_pool().num_blocks());
}

// Guesses the given continuation of a prompt, with every third guess wrong.
class ContinuationDrafter : public Drafter {
 public:
  ContinuationDrafter(std::vector<int32_t> prompt, std::vector<int32_t> continuation)
      : prompt_(std::move(prompt)), continuation_(std::move(continuation)) {}
  Draft propose(const DraftRequest& r) override {
    Draft d;
    const size_t done = r.tokens.size() - prompt_.size();
    for (size_t i = done; i < continuation_.size() && int(d.tokens.size()) < r.max_tokens; ++i)
      d.tokens.push_back(i % 3 == 2 ? (continuation_[i] + 1) % 500 : continuation_[i]);
    return d;
  }

 private:
  std::vector<int32_t> prompt_, continuation_;
};

TEST(EngineDeviceSampling, SpeculativeVerifyRowsDrawOnTheDeviceAtTheirOwnTokenIndex) {
  // A seeded sampled request verified on the device sampler: row i of a verify step draws with
  // index n + i, so the request emits exactly its tokens without speculation, and no logits cross
  // to the host.
  constexpr uint64_t kSeed = 5151;
  constexpr int kTokens = 14;
  const auto prompt = random_prompt(11, 31);
  std::vector<int32_t> plain;
  {
    SmallModel m(recording_backend());
    Engine engine(m.model, engine_config(64));
    EventLog log;
    ASSERT_TRUE(engine.submit(seeded_request("s", prompt, kSeed, kTokens), log.callback("s")));
    engine.run_until_idle();
    plain = log.get("s").tokens;
  }
  ASSERT_EQ(int(plain.size()), kTokens);
  SmallModel m(recording_backend(), /*max_step_tokens=*/256, /*max_logit_rows=*/80);
  auto& backend = static_cast<RecordingDeviceSamplerBackend&>(*m.backend);
  EngineConfig c = engine_config(64);
  c.speculative.method = "ngram";
  c.speculative.num_speculative_tokens = 3;
  c.drafter = std::make_shared<ContinuationDrafter>(prompt, plain);
  Engine engine(m.model, c);
  EventLog log;
  ASSERT_TRUE(engine.submit(seeded_request("s", prompt, kSeed, kTokens), log.callback("s")));
  engine.run_until_idle();
  EXPECT_EQ(log.get("s").tokens, plain);
  const GeneratorStats s = engine.stats();
  EXPECT_GT(s.spec_accepted_tokens, 0u);
  EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);  // the wrong guesses were rejected
  EXPECT_EQ(backend.to_host_calls, 0) << "verify rows are drawn on the device; only ids come back";
  bool saw_verify = false;
  for (const auto& call : backend.calls) {
    if (call.rows.size() < 2) continue;
    saw_verify = true;
    for (size_t i = 1; i < call.rows.size(); ++i) EXPECT_EQ(call.rows[i].draw_index, call.rows[0].draw_index + i);
  }
  EXPECT_TRUE(saw_verify);
}

TEST(EngineDeviceSampling, MinTokensRowsGoToTheHostUntilStopIdsAreAllowed) {
  SmallModel m(recording_backend());
  Engine engine(m.model, engine_config(64));
  EventLog log;
  GenerationRequest r = seeded_request("m", random_prompt(9, 5), 99, 6);
  r.sampling.ignore_eos = false;  // EOS (511) is suppressed below min_tokens
  r.sampling.min_tokens = 3;
  ASSERT_TRUE(engine.submit(r, log.callback("m")));
  engine.run_until_idle();
  const auto s = log.get("m");
  ASSERT_TRUE(s.finished);
  const int n = s.final_event.completion_tokens;
  ASSERT_GE(n, 3);
  EXPECT_EQ(engine.sampling_counters().host_rows, 3u);
  EXPECT_EQ(engine.sampling_counters().device_rows, uint64_t(n - 3));
  std::vector<uint32_t> want;
  for (int i = 3; i < n; ++i) want.push_back(uint32_t(i));
  EXPECT_EQ(draw_indices(static_cast<RecordingDeviceSamplerBackend&>(*m.backend), 99), want)
      << "the device stream continues at the request's own token index";
}

// StepPlan::greedy_ids_only: set exactly on the steps whose logit rows are all plain greedy. Greedy
// requests (chunked prompts, mixed with decodes): every step with logit rows; a step whose sequences
// only prefill has none and is not marked. A sampled, a logprobs, a constrained or a min_tokens
// request never has a marked step, alone or beside greedy ones.
TEST(EngineDeviceSampling, GreedyOnlyStepsAreMarkedInThePlan) {
  struct Run {
    std::string what;
    std::function<void(GenerationRequest&)> change;  // applied to request 0 of 3 (null: all greedy)
  };
  const Run runs[] = {
      {"all greedy", nullptr},
      {"a sampled request", [](GenerationRequest& r) { r.sampling.temperature = 0.8f, r.sampling.seed = 7; }},
      {"a logprobs request", [](GenerationRequest& r) { r.sampling.logprobs = 1; }},
      {"a constrained request", [](GenerationRequest& r) { r.constraint = std::make_shared<EveryNth>(2); }},
      {"a min_tokens request", [](GenerationRequest& r) { r.sampling.ignore_eos = false, r.sampling.min_tokens = 5; }},
  };
  for (const Run& run : runs) {
    SmallModel m(recording_backend());
    auto& backend = static_cast<RecordingDeviceSamplerBackend&>(*m.backend);
    Engine engine(m.model, engine_config(/*budget=*/21));
    backend.plans.clear();  // the engine's start-up profile step is not the engine's plan
    EventLog log;
    for (int i = 0; i < 3; ++i) {
      GenerationRequest r = greedy_request("r" + std::to_string(i), random_prompt(5 + 11 * i, 40 + uint32_t(i)), 6);
      if (i == 0 && run.change) run.change(r);
      ASSERT_TRUE(engine.submit(r, log.callback(r.id)));
    }
    engine.run_until_idle();
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(log.get("r" + std::to_string(i)).finished) << run.what;
    int marked = 0, with_rows = 0;
    for (const auto& p : backend.plans) {
      with_rows += p.logit_rows > 0;
      marked += p.greedy_ids_only;
      if (p.logit_rows == 0) {
        EXPECT_FALSE(p.greedy_ids_only) << run.what << ": a step without logit rows marked";
      }
    }
    ASSERT_GT(with_rows, 0) << run.what;
    if (!run.change) {
      EXPECT_EQ(marked, with_rows) << run.what;
    } else {
      // Request 0 (the shortest prompt, admitted first) samples in each of the first steps with logit
      // rows until it is done: at least 5 (min_tokens keeps its first 5 rows on the host sampler).
      int seen = 0;
      for (const auto& p : backend.plans) {
        if (p.logit_rows == 0) continue;
        if (seen++ == 5) break;
        EXPECT_FALSE(p.greedy_ids_only) << run.what << ": step " << seen << " with its row marked greedy-only";
      }
    }
  }
}

}  // namespace
}  // namespace ossrt
