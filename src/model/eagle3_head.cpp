#include "model/eagle3_head.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/rope.h"
#include "model/weight_shard.h"

namespace ossrt {

namespace {

// A float32 host tensor over `data` (kept alive by the caller until the backend has copied it).
HostTensor f32_tensor(const std::vector<float>& data, std::vector<int64_t> shape, std::string name) {
  HostTensor t;
  t.data = data.data();
  t.dtype = DType::F32;
  t.shape = std::move(shape);
  t.name = std::move(name);
  return t;
}

// Float rows into a backend tensor of the activation dtype.
void rows_from_host(Backend& backend, Tensor dst, std::span<const float> src) {
  OSSRT_CHECK(int64_t(src.size()) == dst.numel(), "EAGLE-3 head: {} values for a {} tensor", src.size(),
              dst.shape_str());
  if (dst.dtype == DType::F32) {
    backend.from_host(dst, src.data());
    return;
  }
  OSSRT_CHECK(dst.dtype == DType::BF16, "EAGLE-3 head: activations of dtype {} are not supported",
              dtype_name(dst.dtype));
  std::vector<uint16_t> bf16(src.size());
  for (size_t i = 0; i < src.size(); ++i) bf16[i] = f32_to_bf16(src[i]);
  backend.from_host(dst, bf16.data());
}

}  // namespace

struct Eagle3Head::Weights {
  Tensor fc, input_norm, embed, input_layernorm, hidden_norm;
  Tensor qkv_from_embed, qkv_from_hidden;  // the q|k|v weights' column halves: [e | hn] split in two
  Tensor o, post_attention_layernorm, sinks;
  Tensor router_w, router_b;  // one expert, chosen by every row with weight 1
  ExpertWeights mlp;
  Tensor norm, lm_head;
};

// Activation buffers planned for max_step_tokens rows (T) and max_logit_rows rows (R).
struct Eagle3Head::Workspace {
  Tensor states, states_normed;  // [T, n * H_t]
  Tensor x;                      // [T, H] the head's residual stream
  Tensor emb, emb_normed, hid_normed;
  // [T, (Hq + 2 Hkv) D]: the two halves' projections summed in the residual dtype (the CUDA
  // backend's add takes an f32 sum), then qkv in the activation dtype for RoPE and the cache (the
  // same tensor as qkv_sum where the two dtypes are one, as on the CPU).
  Tensor qkv_sum, qkv_hidden, qkv;
  Tensor attn, attn_out, mlp_in, mlp_out;
  Tensor route_ids, route_weights;  // [T, 1]
  Tensor last, last_normed;         // [R, H] the logit rows' output, before and after the final norm
  Tensor logits;                    // [R, V_draft] F32
};

Eagle3Head::Eagle3Head(Backend& backend, const Eagle3HostWeights& host, int max_step_tokens, int max_logit_rows)
    : backend_(backend),
      config_(host.config),
      max_step_tokens_(max_step_tokens),
      max_logit_rows_(max_logit_rows),
      d2t_(host.d2t) {
  const Eagle3Config& c = config_;
  OSSRT_CHECK(max_step_tokens > 0 && max_logit_rows > 0 && max_logit_rows <= max_step_tokens,
              "EAGLE-3 head: limits of {} rows and {} logit rows", max_step_tokens, max_logit_rows);
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t S = int64_t(c.aux_layers.size()) * c.target_hidden_size;

  // Plain RoPE at the head's theta, made as HF's default RoPE is (model/rope.cpp).
  GptOssConfig rope_config;
  rope_config.head_dim = c.head_dim;
  rope_config.rope.theta = c.rope_theta;
  rope_config.rope.yarn = false;
  rope_config.rope.factor = 1.0;
  rope_ = compute_rope_params(rope_config);

  KeepAlive keep;
  w_ = std::make_shared<Weights>();
  Weights& w = *w_;
  const HostTensor* fc_parts[] = {&host.fc};
  w.fc = backend.upload_linear(fc_parts);
  if (c.norm_before_fc) w.input_norm = backend.upload(host.input_norm);
  w.embed = backend.upload(host.embed);
  w.input_layernorm = backend.upload(host.input_layernorm);
  w.hidden_norm = backend.upload(host.hidden_norm);
  const IndexRange embed_cols{0, H}, hidden_cols{H, H};
  const HostTensor qe = slice_columns(host.q_w, embed_cols, keep), ke = slice_columns(host.k_w, embed_cols, keep),
                   ve = slice_columns(host.v_w, embed_cols, keep);
  const HostTensor qh = slice_columns(host.q_w, hidden_cols, keep), kh = slice_columns(host.k_w, hidden_cols, keep),
                   vh = slice_columns(host.v_w, hidden_cols, keep);
  const HostTensor* from_embed[] = {&qe, &ke, &ve};
  const HostTensor* from_hidden[] = {&qh, &kh, &vh};
  w.qkv_from_embed = backend.upload_linear(from_embed);
  w.qkv_from_hidden = backend.upload_linear(from_hidden);
  const HostTensor* o_parts[] = {&host.o_w};
  w.o = backend.upload_linear(o_parts);
  w.post_attention_layernorm = backend.upload(host.post_attention_layernorm);
  // No sink: a sink logit of -1e30 adds exp(-1e30 - max) = 0 to every softmax denominator.
  const std::vector<float> sinks(size_t(Hq), -1e30f);
  w.sinks = backend.upload(f32_tensor(sinks, {Hq}, "eagle3.sinks"));
  // The router: zero logits for one expert, so top-1 picks it with softmax weight exactly 1.
  const std::vector<float> router_w(size_t(H), 0.0f), router_b(1, 0.0f);
  w.router_w = backend.upload(f32_tensor(router_w, {1, H}, "eagle3.router.weight"));
  w.router_b = backend.upload(f32_tensor(router_b, {1}, "eagle3.router.bias"));
  // The SiLU MLP as that expert: gate_up rows interleaved (2j gate j, 2j+1 up j), up bias -1 against
  // the clamped SwiGLU's (up + 1); down as it is, no bias.
  std::vector<float> gate_up(size_t(2 * I * H)), gate_up_bias(size_t(2 * I), 0.0f), down_bias(size_t(H), 0.0f);
  for (int64_t j = 0; j < I; ++j) {
    host.gate_w.to_f32(j * H, H, gate_up.data() + (2 * j) * H);
    host.up_w.to_f32(j * H, H, gate_up.data() + (2 * j + 1) * H);
    gate_up_bias[size_t(2 * j + 1)] = -1.0f;
  }
  HostExperts gu;
  gu.format = HostExperts::Format::Dense;
  gu.experts = 1, gu.out = 2 * I, gu.in = H;
  gu.weight = f32_tensor(gate_up, {1, 2 * I, H}, "eagle3.mlp.gate_up");
  gu.bias = f32_tensor(gate_up_bias, {1, 2 * I}, "eagle3.mlp.gate_up.bias");
  HostExperts down;
  down.format = HostExperts::Format::Dense;
  down.experts = 1, down.out = H, down.in = I;
  down.weight = host.down_w;
  down.weight.shape = {1, H, I};
  down.bias = f32_tensor(down_bias, {1, H}, "eagle3.mlp.down.bias");
  w.mlp = backend.upload_experts(gu, down);
  w.norm = backend.upload(host.norm);
  const HostTensor* head_parts[] = {&host.lm_head};
  w.lm_head = backend.upload_linear(head_parts);
  backend.sync();  // the host buffers above die here

  const int64_t T = max_step_tokens, R = max_logit_rows, Vd = host.lm_head.shape[0];
  const DType act = backend.activation_dtype(), res = backend.residual_dtype();
  ws_ = std::make_shared<Workspace>();
  Workspace& ws = *ws_;
  ws.states = backend.alloc(act, {T, S});
  if (c.norm_before_fc) ws.states_normed = backend.alloc(act, {T, S});
  ws.x = backend.alloc(res, {T, H});
  ws.emb = backend.alloc(res, {T, H});
  ws.emb_normed = backend.alloc(act, {T, H});
  ws.hid_normed = backend.alloc(act, {T, H});
  ws.qkv_sum = backend.alloc(res, {T, (Hq + 2 * Hkv) * D});
  ws.qkv_hidden = backend.alloc(act, {T, (Hq + 2 * Hkv) * D});
  ws.qkv = act == res ? ws.qkv_sum : backend.alloc(act, {T, (Hq + 2 * Hkv) * D});
  ws.attn = backend.alloc(act, {T, Hq * D});
  ws.attn_out = backend.alloc(act, {T, H});
  ws.mlp_in = backend.alloc(act, {T, H});
  ws.mlp_out = backend.alloc(act, {T, H});
  ws.route_ids = backend.alloc(DType::I32, {T, 1});
  ws.route_weights = backend.alloc(DType::F32, {T, 1});
  ws.last = backend.alloc(res, {R, H});
  ws.last_normed = backend.alloc(act, {R, H});
  ws.logits = backend.alloc(DType::F32, {R, Vd});
}

void Eagle3Head::allocate_kv_cache(int num_blocks, int block_size) {
  KvCacheShape shape;
  shape.num_full_layers = 1;
  shape.num_sliding_layers = 0;
  shape.num_full_blocks = num_blocks;
  shape.num_window_blocks = 0;
  shape.block_size = block_size;
  shape.num_kv_heads = config_.num_key_value_heads;
  shape.head_dim = config_.head_dim;
  backend_.allocate_kv_cache(shape);
}

std::vector<int32_t> Eagle3Head::step_from_target(const StepPlan& plan, std::span<const float> target_states) {
  const int64_t T = plan.num_tokens();
  OSSRT_CHECK(T <= max_step_tokens_, "EAGLE-3 head: a step of {} rows, planned for {}", T, max_step_tokens_);
  Workspace& ws = *ws_;
  Tensor states = ws.states.rows(0, T), x = ws.x.rows(0, T);
  rows_from_host(backend_, states, target_states);
  backend_.begin_step(plan);
  if (config_.norm_before_fc) {
    Tensor normed = ws.states_normed.rows(0, T);
    backend_.rmsnorm(states, w_->input_norm, float(config_.rms_norm_eps), normed);
    states = normed;
  }
  backend_.linear(states, w_->fc, nullptr, x);
  return run(plan, x);
}

std::vector<int32_t> Eagle3Head::step_from_previous(const StepPlan& plan) {
  const int64_t T = plan.num_tokens();
  OSSRT_CHECK(T == last_rows_ && int64_t(plan.logit_rows.size()) == T,
              "EAGLE-3 head: a chain step of {} rows ({} logit rows) after a step of {} logit rows", T,
              plan.logit_rows.size(), last_rows_);
  Workspace& ws = *ws_;
  Tensor x = ws.x.rows(0, T);
  // The normed output is in the activation dtype: copy converts it to the residual's where they differ.
  backend_.copy(config_.norm_output ? ws.last_normed.rows(0, T) : ws.last.rows(0, T), x);
  backend_.begin_step(plan);
  return run(plan, x);
}

std::vector<int32_t> Eagle3Head::run(const StepPlan& plan, const Tensor& hidden) {
  const Eagle3Config& c = config_;
  const Weights& w = *w_;
  Workspace& ws = *ws_;
  const int64_t T = plan.num_tokens(), R = int64_t(plan.logit_rows.size());
  OSSRT_CHECK(R <= max_logit_rows_, "EAGLE-3 head: {} logit rows, planned for {}", R, max_logit_rows_);
  const float eps = float(c.rms_norm_eps);
  Tensor x = hidden;  // the residual stream starts as the hidden state (ws.x)
  Tensor emb = ws.emb.rows(0, T), emb_normed = ws.emb_normed.rows(0, T), hid_normed = ws.hid_normed.rows(0, T);
  Tensor qkv_sum = ws.qkv_sum.rows(0, T), qkv_hidden = ws.qkv_hidden.rows(0, T), qkv = ws.qkv.rows(0, T);
  Tensor attn = ws.attn.rows(0, T);
  Tensor attn_out = ws.attn_out.rows(0, T), mlp_in = ws.mlp_in.rows(0, T), mlp_out = ws.mlp_out.rows(0, T);
  Tensor ids = ws.route_ids.rows(0, T), weights = ws.route_weights.rows(0, T);

  backend_.embedding(w.embed, emb);
  backend_.rmsnorm(emb, w.input_layernorm, eps, emb_normed);
  backend_.rmsnorm(x, w.hidden_norm, eps, hid_normed);
  if (c.norm_before_residual) backend_.copy(hid_normed, x);  // converted to the residual dtype where it differs
  // qkv([e | hn]) = W[:, :H] e + W[:, H:] hn
  backend_.linear(emb_normed, w.qkv_from_embed, nullptr, qkv_sum);
  backend_.linear(hid_normed, w.qkv_from_hidden, nullptr, qkv_hidden);
  backend_.add(qkv_sum, qkv_hidden);
  if (qkv.data != qkv_sum.data) backend_.copy(qkv_sum, qkv);  // f32 -> bf16 on CUDA
  AttentionParams ap;
  ap.group = KvGroup::Full;
  ap.layer_in_group = 0;
  ap.window = 0;
  ap.num_q_heads = c.num_attention_heads;
  ap.num_kv_heads = c.num_key_value_heads;
  ap.head_dim = c.head_dim;
  ap.sm_scale = float(1.0 / std::sqrt(double(c.head_dim)));
  backend_.rope_and_cache_write(qkv, rope_, ap);
  backend_.attention(qkv, w.sinks, ap, attn);
  backend_.linear(attn, w.o, nullptr, attn_out);
  backend_.add(x, attn_out);
  backend_.rmsnorm(x, w.post_attention_layernorm, eps, mlp_in);
  backend_.router_topk(mlp_in, w.router_w, w.router_b, 1, ids, weights);
  const SwigluParams silu{1.0f, std::numeric_limits<float>::max()};
  backend_.moe(mlp_in, w.mlp, ids, weights, silu, mlp_out);
  backend_.add(x, mlp_out);

  Tensor last = ws.last.rows(0, R), last_normed = ws.last_normed.rows(0, R), logits = ws.logits.rows(0, R);
  backend_.gather_logit_rows(x, last);
  backend_.rmsnorm(last, w.norm, eps, last_normed);
  backend_.linear(last_normed, w.lm_head, nullptr, logits);
  last_rows_ = R;

  // Greedy: the device sampler where the backend has one (only ids come back), else the host argmax.
  std::vector<int32_t> ids_out(static_cast<size_t>(R));
  const std::vector<DeviceSamplingRow> greedy(static_cast<size_t>(R));
  if (!backend_.sample_on_device(logits, greedy, ids_out)) {
    const std::vector<float> host = backend_.to_host_f32(logits);
    const size_t V = size_t(logits.dim(1));
    for (size_t r = 0; r < size_t(R); ++r) {
      const float* row = host.data() + r * V;
      ids_out[r] = int32_t(std::max_element(row, row + V) - row);
    }
  }
  if (!d2t_.empty())
    for (int32_t& id : ids_out) id = d2t_[size_t(id)];
  return ids_out;
}

std::vector<float> Eagle3Head::last_logits() { return backend_.to_host_f32(ws_->logits.rows(0, last_rows_)); }

}  // namespace ossrt
