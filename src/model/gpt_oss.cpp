// The gpt-oss forward pass against the Backend op interface (SPEC.md section 2). Reads like the
// architecture on purpose: every dtype, layout and threading decision belongs to the backend.
#include "model/gpt_oss.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ossrt {

namespace {

constexpr double kPi = 3.14159265358979323846;

void expect_shape(const HostTensor& t, std::initializer_list<int64_t> shape, const std::string& what) {
  OSSRT_CHECK(!t.empty(), "model weights: {} ('{}') is missing", what, t.name);
  OSSRT_CHECK(std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end()),
              "model weights: {} ('{}') has shape [{}], expected [{}]", what, t.name, fmt::join(t.shape, ", "),
              fmt::join(shape, ", "));
}

void expect_experts(const HostExperts& x, int64_t experts, int64_t out, int64_t in, const std::string& what) {
  OSSRT_CHECK(x.experts == experts && x.out == out && x.in == in,
              "model weights: {} experts are [{}, {}, {}], expected [{}, {}, {}]", what, x.experts, x.out, x.in,
              experts, out, in);
}

// YaRN correction dimension (SPEC.md 2.5): the rotary index whose wavelength makes `rotations` turns
// over the original context.
double correction_dim(double rotations, int head_dim, double base, double original_context) {
  return head_dim * std::log(original_context / (rotations * 2.0 * kPi)) / (2.0 * std::log(base));
}

}  // namespace

RopeParams compute_rope_params(const GptOssConfig& config) {
  const RopeConfig& r = config.rope;
  const int dim = config.head_dim, half = dim / 2;
  RopeParams p;
  p.inv_freq_f64.resize(size_t(half));
  // YaRN NTK-by-parts (SPEC.md 2.5), in float64; the fp32 table is its rounding. The references
  // compute it in fp32 (within an ulp of this), which matters only for their angles.
  std::vector<double> freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) freq[size_t(i)] = std::pow(r.theta, double(2 * i) / double(dim));
  if (r.factor <= 1.0) {
    for (int i = 0; i < half; ++i) p.inv_freq_f64[size_t(i)] = 1.0 / freq[size_t(i)];
    p.concentration = 1.0f;
  } else {
    const double orig = double(r.original_max_position_embeddings);
    double low = correction_dim(r.beta_fast, dim, r.theta, orig);
    double high = correction_dim(r.beta_slow, dim, r.theta, orig);
    if (r.truncate) low = std::floor(low), high = std::ceil(high);  // gpt-oss sets truncate = false
    low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
    for (int i = 0; i < half; ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation_weight = 1.0 - ramp;  // 1 for the high-frequency (small i) dims
      const double interpolation = 1.0 / (r.factor * freq[size_t(i)]);
      const double extrapolation = 1.0 / freq[size_t(i)];
      p.inv_freq_f64[size_t(i)] = interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight;
    }
    p.concentration = float(0.1 * std::log(r.factor) + 1.0);
  }
  p.inv_freq.assign(p.inv_freq_f64.begin(), p.inv_freq_f64.end());
  return p;
}

// Activation buffers planned once for ModelLimits; each step uses the first T (or R) rows.
struct GptOssModel::Workspace {
  Tensor residual;   // [T, H] the residual stream x
  Tensor normed;     // [T, H] RMSNorm output feeding attention or the MoE
  Tensor qkv;        // [T, (Hq + 2 Hkv) D]
  Tensor attn;       // [T, Hq D]
  Tensor attn_out;   // [T, H] after o_proj
  Tensor router_ids; // [T, k] I32
  Tensor router_weights;  // [T, k] F32
  Tensor moe_out;    // [T, H]
  Tensor logit_in;   // [R, H] residual rows whose logits are wanted
  Tensor final_norm; // [R, H]
  Tensor logits;     // [R, V] F32
};

GptOssModel::GptOssModel(Backend& backend, const HostModelWeights& host, const ModelLimits& limits)
    : backend_(backend), config_(host.config), limits_(limits) {
  const GptOssConfig& c = config_;
  c.validate();
  OSSRT_CHECK(limits.max_step_tokens > 0 && limits.max_logit_rows > 0, "model limits must be positive ({} tokens, {} rows)",
              limits.max_step_tokens, limits.max_logit_rows);
  OSSRT_CHECK(int(host.layers.size()) == c.num_layers, "model weights have {} layers, config says {}",
              host.layers.size(), c.num_layers);
  const int64_t H = c.hidden_size, V = c.vocab_size, E = c.num_experts, I = c.intermediate_size;
  expect_shape(host.embed, {V, H}, "embedding");
  expect_shape(host.final_norm, {H}, "final norm");
  expect_shape(host.lm_head, {V, H}, "lm_head");
  weights_.embed = backend.upload(host.embed);
  weights_.final_norm = backend.upload(host.final_norm);
  weights_.lm_head = backend.upload(host.lm_head);

  for (int l = 0; l < c.num_layers; ++l) {
    const HostLayerWeights& h = host.layers[size_t(l)];
    const std::string at = fmt::format("layer {}", l);
    expect_shape(h.attn_norm, {H}, at + " attention norm");
    expect_shape(h.q_w, {c.q_dim(), H}, at + " q_proj weight");
    expect_shape(h.k_w, {c.kv_dim(), H}, at + " k_proj weight");
    expect_shape(h.v_w, {c.kv_dim(), H}, at + " v_proj weight");
    expect_shape(h.q_b, {c.q_dim()}, at + " q_proj bias");
    expect_shape(h.k_b, {c.kv_dim()}, at + " k_proj bias");
    expect_shape(h.v_b, {c.kv_dim()}, at + " v_proj bias");
    expect_shape(h.o_w, {H, c.q_dim()}, at + " o_proj weight");
    expect_shape(h.o_b, {H}, at + " o_proj bias");
    expect_shape(h.sinks, {c.num_attention_heads}, at + " sinks");
    expect_shape(h.mlp_norm, {H}, at + " MLP norm");
    expect_shape(h.router_w, {E, H}, at + " router weight");
    expect_shape(h.router_b, {E}, at + " router bias");
    expect_experts(h.gate_up, E, 2 * I, H, at + " gate_up");
    expect_experts(h.down, E, H, I, at + " down");

    LayerWeights w;
    w.attn_norm = backend.upload(h.attn_norm);
    const HostTensor* qkv_w[] = {&h.q_w, &h.k_w, &h.v_w};
    const HostTensor* qkv_b[] = {&h.q_b, &h.k_b, &h.v_b};
    w.qkv_w = backend.upload_concat_rows(qkv_w);
    w.qkv_b = backend.upload_concat_rows(qkv_b);
    w.o_w = backend.upload(h.o_w);
    w.o_b = backend.upload(h.o_b);
    w.sinks = backend.upload(h.sinks);
    w.mlp_norm = backend.upload(h.mlp_norm);
    w.router_w = backend.upload(h.router_w);
    w.router_b = backend.upload(h.router_b);
    w.experts = backend.upload_experts(h.gate_up, h.down);
    weights_.layers.push_back(std::move(w));
  }
  rope_ = compute_rope_params(c);

  const int64_t T = limits.max_step_tokens, R = limits.max_logit_rows;
  const DType act = backend.activation_dtype();
  ws_ = std::make_shared<Workspace>();
  ws_->residual = backend.alloc(backend.residual_dtype(), {T, H});
  ws_->normed = backend.alloc(act, {T, H});
  ws_->qkv = backend.alloc(act, {T, c.qkv_dim()});
  ws_->attn = backend.alloc(act, {T, c.q_dim()});
  ws_->attn_out = backend.alloc(act, {T, H});
  ws_->router_ids = backend.alloc(DType::I32, {T, c.experts_per_token});
  ws_->router_weights = backend.alloc(DType::F32, {T, c.experts_per_token});
  ws_->moe_out = backend.alloc(act, {T, H});
  ws_->logit_in = backend.alloc(backend.residual_dtype(), {R, H});
  ws_->final_norm = backend.alloc(act, {R, H});
  ws_->logits = backend.alloc(DType::F32, {R, V});
}

Tensor GptOssModel::forward(const StepPlan& plan) {
  const GptOssConfig& c = config_;
  const int64_t T = plan.num_tokens(), R = int64_t(plan.logit_rows.size());
  OSSRT_CHECK(T <= limits_.max_step_tokens, "step has {} tokens, the model was planned for {}", T,
              limits_.max_step_tokens);
  OSSRT_CHECK(R <= limits_.max_logit_rows, "step wants {} logit rows, the model was planned for {}", R,
              limits_.max_logit_rows);
  const float eps = float(c.rms_norm_eps);
  const SwigluParams swiglu{float(c.swiglu_alpha), float(c.swiglu_limit)};
  auto observe = [&](const std::string& name, const Tensor& t) {
    if (!observer_) return;
    backend_.sync();
    observer_(name, t);
  };

  Workspace& ws = *ws_;
  Tensor x = ws.residual.rows(0, T), normed = ws.normed.rows(0, T), qkv = ws.qkv.rows(0, T);
  Tensor attn = ws.attn.rows(0, T), attn_out = ws.attn_out.rows(0, T), moe_out = ws.moe_out.rows(0, T);
  Tensor ids = ws.router_ids.rows(0, T), weights = ws.router_weights.rows(0, T);

  backend_.begin_step(plan);
  backend_.embedding(weights_.embed, x);
  observe("embed", x);

  int full_index = 0, sliding_index = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights_.layers[size_t(l)];
    const std::string name = fmt::format("layer{}", l);
    AttentionParams ap;
    ap.group = c.is_sliding(l) ? KvGroup::Sliding : KvGroup::Full;
    ap.layer_in_group = c.is_sliding(l) ? sliding_index++ : full_index++;
    ap.window = c.is_sliding(l) ? c.sliding_window : 0;
    ap.num_q_heads = c.num_attention_heads;
    ap.num_kv_heads = c.num_key_value_heads;
    ap.head_dim = c.head_dim;
    ap.sm_scale = float(1.0 / std::sqrt(double(c.head_dim)));

    // x += MoE output of the previous layer (fused with the norm); layer 0 starts from the embedding.
    if (l == 0)
      backend_.rmsnorm(x, w.attn_norm, eps, normed);
    else
      backend_.add_rmsnorm(x, moe_out, w.attn_norm, eps, normed);
    observe(name + ".attn_in", normed);
    backend_.linear(normed, w.qkv_w, &w.qkv_b, qkv);
    observe(name + ".qkv", qkv);
    backend_.rope_and_cache_write(qkv, rope_, ap);
    observe(name + ".qkv_rope", qkv);
    backend_.attention(qkv, w.sinks, ap, attn);
    observe(name + ".attn", attn);
    backend_.linear(attn, w.o_w, &w.o_b, attn_out);
    observe(name + ".attn_out", attn_out);

    backend_.add_rmsnorm(x, attn_out, w.mlp_norm, eps, normed);
    observe(name + ".mlp_in", normed);
    backend_.router_topk(normed, w.router_w, w.router_b, c.experts_per_token, ids, weights);
    observe(name + ".router_ids", ids);
    observe(name + ".router_weights", weights);
    backend_.moe(normed, w.experts, ids, weights, swiglu, moe_out);
    observe(name + ".moe_out", moe_out);
  }
  backend_.add(x, moe_out);
  observe("residual", x);

  Tensor logit_in = ws.logit_in.rows(0, R), final_norm = ws.final_norm.rows(0, R), logits = ws.logits.rows(0, R);
  backend_.gather_logit_rows(x, logit_in);
  backend_.rmsnorm(logit_in, weights_.final_norm, eps, final_norm);
  observe("final_norm", final_norm);
  backend_.linear(final_norm, weights_.lm_head, nullptr, logits);
  observe("logits", logits);
  return logits;
}

}  // namespace ossrt
