// The gpt-oss forward on the CPU backend: against a naive double-precision forward written here from
// docs/reference/SPEC.md section 2, and invariant to how the tokens are split into steps or batched with another
// sequence (chunked prefill reads earlier chunks from the paged cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"

namespace ossrt {
namespace {

// Small shapes with a window of 8 so that a few dozen tokens cross it many times, and 2 query heads
// per KV head so GQA grouping matters.
GptOssConfig small_config() {
  GptOssConfig c = preset_config("tiny");
  c.num_layers = 3;
  c.hidden_size = 64;
  c.intermediate_size = 32;
  c.num_experts = 6;
  c.experts_per_token = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 97;
  c.sliding_window = 8;
  c.experts_mxfp4 = false;
  c.layer_types = {LayerKind::SlidingAttention, LayerKind::FullAttention, LayerKind::SlidingAttention};
  c.name = "forward_test";
  return c;
}

// bf16 weights in owned buffers (independent of the loader), scaled so logits have real margins.
struct OwnedWeights {
  HostModelWeights host;
  std::mt19937 rng{77};

  HostTensor make(std::vector<int64_t> shape, float stddev, float mean = 0.0f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto buf = std::make_shared<std::vector<uint16_t>>(size_t(n));
    std::normal_distribution<float> dist(mean, stddev);
    for (auto& v : *buf) v = f32_to_bf16(dist(rng));
    host.keep_alive.push_back(buf);
    return HostTensor{buf->data(), DType::BF16, std::move(shape), "test"};
  }
  HostExperts experts(int64_t e, int64_t out, int64_t in, float stddev) {
    HostExperts x;
    x.format = HostExperts::Format::Dense;
    x.experts = e, x.out = out, x.in = in;
    x.weight = make({e, out, in}, stddev);
    x.bias = make({e, out}, 0.3f);
    return x;
  }

  explicit OwnedWeights(const GptOssConfig& c) {
    host.config = c;
    const int64_t H = c.hidden_size, E = c.num_experts, I = c.intermediate_size;
    host.embed = make({c.vocab_size, H}, 1.0f);
    host.final_norm = make({H}, 0.1f, 1.0f);
    host.lm_head = make({c.vocab_size, H}, 0.5f);
    for (int l = 0; l < c.num_layers; ++l) {
      HostLayerWeights w;
      w.attn_norm = make({H}, 0.1f, 1.0f);
      w.q_w = make({c.q_dim(), H}, 0.4f), w.q_b = make({c.q_dim()}, 0.2f);
      w.k_w = make({c.kv_dim(), H}, 0.4f), w.k_b = make({c.kv_dim()}, 0.2f);
      w.v_w = make({c.kv_dim(), H}, 0.4f), w.v_b = make({c.kv_dim()}, 0.2f);
      w.o_w = make({H, c.q_dim()}, 0.3f), w.o_b = make({H}, 0.2f);
      w.sinks = make({c.num_attention_heads}, 1.0f);
      w.mlp_norm = make({H}, 0.1f, 1.0f);
      w.router_w = make({E, H}, 0.5f), w.router_b = make({E}, 0.3f);
      w.gate_up = experts(E, 2 * I, H, 0.4f);
      w.down = experts(E, H, I, 0.3f);
      host.layers.push_back(std::move(w));
    }
  }
};

// ---- the naive reference forward, in double, straight from docs/reference/SPEC.md section 2

using Mat = std::vector<double>;  // row-major

Mat to_double(const HostTensor& t) {
  Mat m(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) m[size_t(i)] = t.at(i);
  return m;
}

Mat linear_ref(const Mat& x, int64_t rows, int64_t in, const HostTensor& w, const HostTensor* b) {
  const int64_t out = w.shape[0];
  const Mat W = to_double(w), B = b ? to_double(*b) : Mat(size_t(out), 0.0);
  Mat y(size_t(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = B[size_t(o)];
      for (int64_t i = 0; i < in; ++i) s += x[size_t(r * in + i)] * W[size_t(o * in + i)];
      y[size_t(r * out + o)] = s;
    }
  return y;
}

Mat rmsnorm_ref(const Mat& x, int64_t rows, int64_t n, const HostTensor& w, double eps) {
  const Mat W = to_double(w);
  Mat y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < n; ++i) ms += x[size_t(r * n + i)] * x[size_t(r * n + i)] / double(n);
    for (int64_t i = 0; i < n; ++i) y[size_t(r * n + i)] = x[size_t(r * n + i)] / std::sqrt(ms + eps) * W[size_t(i)];
  }
  return y;
}

// Logits [T, V] of tokens at positions 0..T-1 (one sequence, everything in memory, no cache).
Mat reference_forward(const HostModelWeights& w, const std::vector<int32_t>& ids) {
  const GptOssConfig& c = w.config;
  const int64_t T = int64_t(ids.size()), H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads;
  const int64_t Hkv = c.num_key_value_heads, I = c.intermediate_size, E = c.num_experts;
  const RopeParams rope = compute_rope_params(c);  // checked against SPEC's table in cpu_ops_test
  const Mat embed = to_double(w.embed);
  Mat x(size_t(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) x[size_t(t * H + i)] = embed[size_t(ids[size_t(t)] * H + i)];

  for (int l = 0; l < c.num_layers; ++l) {
    const HostLayerWeights& lw = w.layers[size_t(l)];
    const Mat h = rmsnorm_ref(x, T, H, lw.attn_norm, c.rms_norm_eps);
    Mat q = linear_ref(h, T, H, lw.q_w, &lw.q_b), k = linear_ref(h, T, H, lw.k_w, &lw.k_b);
    const Mat v = linear_ref(h, T, H, lw.v_w, &lw.v_b);
    auto rotate = [&](Mat& m, int64_t heads) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t hd = 0; hd < heads; ++hd)
          for (int64_t i = 0; i < D / 2; ++i) {
            // The reference's float32 angle (one float32 product; docs/cpu_backend.md, RoPE).
            const float angle = float(t) * rope.inv_freq[size_t(i)];
            const double cs = std::cos(double(angle)) * rope.concentration;
            const double sn = std::sin(double(angle)) * rope.concentration;
            double& a = m[size_t((t * heads + hd) * D + i)];
            double& b = m[size_t((t * heads + hd) * D + i + D / 2)];
            const double a0 = a, b0 = b;
            a = a0 * cs - b0 * sn;
            b = b0 * cs + a0 * sn;
          }
    };
    rotate(q, Hq);
    rotate(k, Hkv);
    const Mat sinks = to_double(lw.sinks);
    const bool sliding = c.is_sliding(l);
    Mat attn(size_t(T * Hq * D), 0.0);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t hd = 0; hd < Hq; ++hd) {
        const int64_t g = hd / (Hq / Hkv);
        std::vector<double> logits(size_t(i + 1), -INFINITY);
        double m = sinks[size_t(hd)];
        for (int64_t j = 0; j <= i; ++j) {
          if (sliding && i - j >= c.sliding_window) continue;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += q[size_t((i * Hq + hd) * D + d)] * k[size_t((j * Hkv + g) * D + d)];
          logits[size_t(j)] = s / std::sqrt(double(D));
          m = std::max(m, logits[size_t(j)]);
        }
        double denom = std::exp(sinks[size_t(hd)] - m);
        for (double lg : logits) denom += std::exp(lg - m);
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t d = 0; d < D; ++d)
            attn[size_t((i * Hq + hd) * D + d)] +=
                std::exp(logits[size_t(j)] - m) / denom * v[size_t((j * Hkv + g) * D + d)];
      }
    const Mat o = linear_ref(attn, T, Hq * D, lw.o_w, &lw.o_b);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];

    const Mat hm = rmsnorm_ref(x, T, H, lw.mlp_norm, c.rms_norm_eps);
    const Mat router = linear_ref(hm, T, H, lw.router_w, &lw.router_b);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int64_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return router[size_t(t * E + a)] > router[size_t(t * E + b)]; });
      double denom = 0;
      for (int s = 0; s < c.experts_per_token; ++s) denom += std::exp(router[size_t(t * E + order[size_t(s)])]);
      for (int s = 0; s < c.experts_per_token; ++s) {
        const int64_t e = order[size_t(s)];
        const double weight = std::exp(router[size_t(t * E + e)]) / denom;
        std::vector<float> row(static_cast<size_t>(std::max(H, I)));
        std::vector<double> act(static_cast<size_t>(I));
        for (int64_t j = 0; j < I; ++j) {
          double gate = lw.gate_up.bias.at(e * 2 * I + 2 * j), up = lw.gate_up.bias.at(e * 2 * I + 2 * j + 1);
          lw.gate_up.row_f32(e, 2 * j, row.data());
          for (int64_t i = 0; i < H; ++i) gate += row[size_t(i)] * hm[size_t(t * H + i)];
          lw.gate_up.row_f32(e, 2 * j + 1, row.data());
          for (int64_t i = 0; i < H; ++i) up += row[size_t(i)] * hm[size_t(t * H + i)];
          gate = std::min(gate, c.swiglu_limit);
          up = std::clamp(up, -c.swiglu_limit, c.swiglu_limit);
          act[size_t(j)] = gate / (1.0 + std::exp(-c.swiglu_alpha * gate)) * (up + 1.0);
        }
        for (int64_t r = 0; r < H; ++r) {
          lw.down.row_f32(e, r, row.data());
          double y = lw.down.bias.at(e * H + r);
          for (int64_t j = 0; j < I; ++j) y += row[size_t(j)] * act[size_t(j)];
          x[size_t(t * H + r)] += weight * y;
        }
      }
    }
  }
  const Mat f = rmsnorm_ref(x, T, H, w.final_norm, c.rms_norm_eps);
  return linear_ref(f, T, H, w.lm_head, nullptr);
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, ref = 1e-30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::abs(double(b[i])));
  }
  return diff / ref;
}

std::vector<int32_t> random_ids(int n, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = dist(rng);
  return ids;
}

class ForwardTest : public ::testing::Test {
 protected:
  ForwardTest()
      : weights_(small_config()),
        backend_(make_cpu_backend(BackendOptions{.threads = 2})),
        model_(*backend_, weights_.host, ModelLimits{.max_step_tokens = 128, .max_logit_rows = 128}) {}

  std::vector<float> run_chunked(const std::vector<int32_t>& ids, int chunk) {
    SingleSequenceRunner runner(model_, int(ids.size()), /*block_size=*/4);
    return runner.run(ids, chunk, SingleSequenceRunner::Logits::EveryRow);
  }

  OwnedWeights weights_;
  std::unique_ptr<Backend> backend_;
  GptOssModel model_;
};

TEST_F(ForwardTest, MatchesNaiveDoubleForward) {
  const auto ids = random_ids(40, small_config().vocab_size, 1);
  const Mat ref = reference_forward(weights_.host, ids);
  const std::vector<float> got = run_chunked(ids, 0);
  const std::vector<float> ref_f(ref.begin(), ref.end());
  const int64_t V = small_config().vocab_size;
  for (size_t t = 0; t < ids.size(); ++t) {
    std::vector<float> a(got.begin() + t * V, got.begin() + (t + 1) * V),
        b(ref_f.begin() + t * V, ref_f.begin() + (t + 1) * V);
    EXPECT_LT(max_rel_diff(a, b), 1e-4) << "position " << t;
  }
  // The reference itself is not degenerate: logits spread over several units.
  const auto [lo, hi] = std::minmax_element(ref.begin(), ref.end());
  EXPECT_GT(*hi - *lo, 5.0);
}

TEST_F(ForwardTest, ChunkSizeDoesNotChangeLogits) {
  const auto ids = random_ids(100, small_config().vocab_size, 2);
  const std::vector<float> whole = run_chunked(ids, 100);
  for (int chunk : {1, 7, 64}) EXPECT_LT(max_rel_diff(run_chunked(ids, chunk), whole), 1e-5) << "chunk " << chunk;
}

TEST_F(ForwardTest, BatchedWithAnotherSequence) {
  const int V = small_config().vocab_size, bs = 4;
  const auto a = random_ids(60, V, 3), b = random_ids(45, V, 4);
  const std::vector<float> a_alone = run_chunked(a, 0), b_alone = run_chunked(b, 0);

  // Two sequences with their own blocks in one cache; three steps mixing prefill chunks and decodes.
  const int window = small_config().sliding_window, ring = window_ring_blocks(window, 128, bs);
  const LinearKvLayout la{.block_size = bs, .full_block_base = 0, .window_block_base = 0, .num_window_blocks = ring};
  const LinearKvLayout lb{
      .block_size = bs, .full_block_base = 20, .window_block_base = ring, .num_window_blocks = ring};
  const GptOssConfig& c = model_.config();
  backend_->allocate_kv_cache(KvCacheShape{.num_full_layers = c.num_full_layers(),
                                           .num_sliding_layers = c.num_sliding_layers(),
                                           .num_full_blocks = 40,
                                           .num_window_blocks = 2 * ring,
                                           .block_size = bs,
                                           .num_kv_heads = c.num_key_value_heads,
                                           .head_dim = c.head_dim});
  std::vector<float> a_batched, b_batched;
  const std::vector<std::pair<int, int>> steps = {{30, 13}, {1, 31}, {29, 1}};  // tokens of a, of b per step
  int pa = 0, pb = 0;
  for (auto [na, nb] : steps) {
    StepPlan plan;
    append_sequence_step(plan, lb, std::span(b).subspan(size_t(pb), size_t(nb)), pb, window, true);
    append_sequence_step(plan, la, std::span(a).subspan(size_t(pa), size_t(na)), pa, window, true);
    const std::vector<float> logits = backend_->to_host_f32(model_.forward(plan));
    b_batched.insert(b_batched.end(), logits.begin(), logits.begin() + int64_t(nb) * V);
    a_batched.insert(a_batched.end(), logits.begin() + int64_t(nb) * V, logits.end());
    pa += na, pb += nb;
  }
  ASSERT_EQ(pa, 60);
  ASSERT_EQ(pb, 45);
  EXPECT_LT(max_rel_diff(a_batched, a_alone), 1e-5);
  EXPECT_LT(max_rel_diff(b_batched, b_alone), 1e-5);
}

TEST_F(ForwardTest, LastRowOnlyAndObserverNames) {
  const auto ids = random_ids(20, small_config().vocab_size, 5);
  const std::vector<float> all = run_chunked(ids, 0);
  std::vector<std::string> names;
  std::vector<float> observed_logits;
  model_.set_observer([&](const std::string& name, const Tensor& t) {
    names.push_back(name);
    if (name == "logits") observed_logits = backend_->to_host_f32(t);
  });
  SingleSequenceRunner runner(model_, 20, 4);
  const std::vector<float> last = runner.run(ids, 6, SingleSequenceRunner::Logits::LastRow);
  const int V = small_config().vocab_size;
  EXPECT_EQ(last, std::vector<float>(all.end() - V, all.end()));
  EXPECT_EQ(observed_logits, last);
  const std::set<std::string> seen(names.begin(), names.end());
  for (const char* n : {"embed", "layer0.attn_in", "layer0.qkv", "layer1.attn", "layer2.attn_out", "layer2.mlp_in",
                        "layer1.router_ids", "layer2.moe_out", "final_norm", "logits"})
    EXPECT_TRUE(seen.count(n)) << n;
  EXPECT_EQ(std::count(names.begin(), names.end(), "embed"), 4);  // one per step of 6, 6, 6, 2 tokens
}

TEST_F(ForwardTest, LimitsAndBadWeightsAreErrors) {
  const auto ids = random_ids(129, small_config().vocab_size, 6);
  SingleSequenceRunner runner(model_, 129, 4);
  EXPECT_THROW(runner.run(ids, 129, SingleSequenceRunner::Logits::LastRow), Error);  // over max_step_tokens
  OwnedWeights bad(small_config());
  bad.host.layers[1].o_w = bad.make({7, 7}, 1.0f);
  EXPECT_THROW(GptOssModel(*backend_, bad.host, ModelLimits{}), Error);
}

TEST(ForwardTinyPreset, DummyWeightsChunkedEqualsWhole) {
  const HostModelWeights w = load_model_weights(ModelSource{"tiny", "dummy", 11});
  auto backend = make_cpu_backend(BackendOptions{.threads = 2});
  GptOssModel model(*backend, w, ModelLimits{.max_step_tokens = 48, .max_logit_rows = 48});
  const auto ids = random_ids(48, w.config.vocab_size, 7);
  SingleSequenceRunner runner(model, 48);
  const std::vector<float> whole = runner.run(ids, 48, SingleSequenceRunner::Logits::EveryRow);
  runner.reset();
  const std::vector<float> chunked = runner.run(ids, 16, SingleSequenceRunner::Logits::EveryRow);
  ASSERT_EQ(whole.size(), size_t(48) * size_t(w.config.vocab_size));
  EXPECT_TRUE(std::all_of(whole.begin(), whole.end(), [](float v) { return std::isfinite(v); }));
  EXPECT_LT(max_rel_diff(chunked, whole), 1e-5);
}

}  // namespace
}  // namespace ossrt
