// The gpt-oss forward pass against the Backend op interface (docs/reference/SPEC.md section 2). Reads like the
// architecture on purpose: every dtype, layout and threading decision belongs to the backend.
#include "model/gpt_oss.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "model/moe_block.h"
#include "model/moe_dispatch.h"
#include "model/weight_shard.h"

namespace ossrt {

namespace {

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

}  // namespace

// Activation buffers planned once for ModelLimits; each step uses the first T (or R) rows. Widths
// are this rank's (q heads, vocab). The MoE block plans its own (model/moe_block.h).
struct GptOssModel::Workspace {
  Tensor residual;  // [T, H] the residual stream x
  // [T, H] the residual stream's other buffer: a layer after the first adds the previous MoE output
  // out of place (add_rmsnorm_qkv_rope_cache_write), so the stream alternates between the two.
  Tensor residual_alt;
  Tensor normed;      // [T, H] RMSNorm output feeding attention or the MoE
  Tensor qkv;         // [T, (Hq + 2 Hkv) D]
  Tensor attn;        // [T, Hq D]
  Tensor attn_out;    // [T, H] after o_proj
  Tensor logit_in;    // [R, H] residual rows whose logits are wanted
  Tensor final_norm;  // [R, H]
  Tensor logits;      // [R, V] F32
  // [R, V / tp] F32: this rank's vocab columns; the same view as `logits` when tp = 1.
  Tensor lm_head_out;
};

GptOssModel::LocalDims GptOssModel::local_dims(const GptOssConfig& c, const ModelShard& s) {
  auto check_part = [](int rank, int size, const char* what) {
    OSSRT_CHECK(size >= 1 && rank >= 0 && rank < size, "model shard: {} rank {} of {}", what, rank, size);
  };
  check_part(s.tp_rank, s.tp_size, "tensor-parallel");
  check_part(s.expert_rank, s.expert_size, "expert-parallel");
  check_part(s.expert_tp_rank, s.expert_tp_size, "expert tensor-parallel");
  check_part(s.dp_rank, s.dp_size, "data-parallel");
  const int tp = s.tp_size, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  OSSRT_CHECK(Hq % tp == 0 && (Hkv % tp == 0 || tp % Hkv == 0) && c.vocab_size % tp == 0,
              "model shard: tensor parallel size {} must divide {} attention heads and {} vocab rows, and divide or "
              "be a multiple of {} KV heads",
              tp, Hq, c.vocab_size, Hkv);
  OSSRT_CHECK(c.num_experts % s.expert_size == 0, "model shard: expert parallel size {} does not divide {} experts",
              s.expert_size, c.num_experts);
  OSSRT_CHECK(c.intermediate_size % s.expert_tp_size == 0,
              "model shard: {} ranks per expert group do not divide the intermediate size {}", s.expert_tp_size,
              c.intermediate_size);
  OSSRT_CHECK(tp == 1 || s.tp, "model shard: tensor parallel size {} without a communicator", tp);
  OSSRT_CHECK(s.dp_size == 1 || s.dp, "model shard: data parallel size {} without a communicator", s.dp_size);
  OSSRT_CHECK((s.expert_size == 1 && s.expert_tp_size == 1) || s.moe,
              "model shard: a sharded MoE without a communicator");
  LocalDims d;
  d.q_heads = Hq / tp;
  d.first_q_head = s.tp_rank * d.q_heads;
  // More ranks than KV heads: each rank keeps (replicates) the one KV head its query heads read.
  d.kv_heads = Hkv >= tp ? Hkv / tp : 1;
  d.first_kv_head = Hkv >= tp ? s.tp_rank * d.kv_heads : s.tp_rank / (tp / Hkv);
  d.vocab = c.vocab_size / tp;
  d.first_vocab = s.tp_rank * d.vocab;
  d.experts = c.num_experts / s.expert_size;
  d.first_expert = s.expert_rank * d.experts;
  d.intermediate = c.intermediate_size / s.expert_tp_size;
  d.first_intermediate = s.expert_tp_rank * d.intermediate;
  return d;
}

GptOssModel::GptOssModel(Backend& backend, const HostModelWeights& host, const ModelLimits& limits,
                         const ModelShard& shard)
    : backend_(backend), config_(host.config), limits_(limits), shard_(shard) {
  const GptOssConfig& c = config_;
  c.validate();
  local_ = local_dims(c, shard);
  OSSRT_CHECK(limits.max_step_tokens > 0 && limits.max_logit_rows > 0,
              "model limits must be positive ({} tokens, {} rows)", limits.max_step_tokens, limits.max_logit_rows);
  OSSRT_CHECK(int(host.layers.size()) == c.num_layers, "model weights have {} layers, config says {}",
              host.layers.size(), c.num_layers);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  expect_shape(host.embed, {V, H}, "embedding");
  expect_shape(host.final_norm, {H}, "final norm");
  expect_shape(host.lm_head, {V, H}, "lm_head");
  // Slices that are not views into the checkpoint (o_proj columns, expert slices) live here until
  // the backend has copied them (the sync below).
  std::vector<std::shared_ptr<void>> keep;
  weights_.embed = backend.upload(host.embed);
  weights_.final_norm = backend.upload(host.final_norm);
  const HostTensor lm_head = slice_rows(host.lm_head, {local_.first_vocab, local_.vocab});
  const HostTensor* lm_head_parts[] = {&lm_head};
  weights_.lm_head =
      shard.tp_size == 1 ? backend.upload_unembedding(lm_head_parts) : backend.upload_linear(lm_head_parts);
  for (int l = 0; l < c.num_layers; ++l) upload_layer(host.layers[size_t(l)], fmt::format("layer {}", l), keep);
  backend.sync();
  rope_ = compute_rope_params(c);

  const int64_t T = limits.max_step_tokens, R = limits.max_logit_rows, D = c.head_dim;
  const DType act = backend.activation_dtype();
  ws_ = std::make_shared<Workspace>();
  ws_->residual = backend.alloc(backend.residual_dtype(), {T, H});
  ws_->residual_alt = backend.alloc(backend.residual_dtype(), {T, H});
  ws_->normed = backend.alloc(act, {T, H});
  ws_->qkv = backend.alloc(act, {T, (local_.q_heads + 2 * local_.kv_heads) * D});
  ws_->attn = backend.alloc(act, {T, local_.q_heads * D});
  ws_->attn_out = backend.alloc(act, {T, H});
  ws_->logit_in = backend.alloc(backend.residual_dtype(), {R, H});
  ws_->final_norm = backend.alloc(act, {R, H});
  ws_->logits = backend.alloc(DType::F32, {R, V});
  ws_->lm_head_out = shard.tp_size > 1 ? backend.alloc(DType::F32, {R, local_.vocab}) : ws_->logits;
  if (shard.moe_dispatch == MoeDispatch::AllToAll)
    moe_ = std::make_shared<MoeDispatcher>(backend, c, shard_, T);
  else
    moe_ = std::make_shared<ReplicatedMoe>(backend, c, shard_, T);
}

void GptOssModel::upload_layer(const HostLayerWeights& h, const std::string& at,
                               std::vector<std::shared_ptr<void>>& keep) {
  const GptOssConfig& c = config_;
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.intermediate_size, D = c.head_dim;
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

  // Heads are contiguous rows of q/k/v (head h = rows [h D, (h+1) D)), so this rank's q heads and
  // the KV heads they read are row views; the fused weight is q_local | k_local | v_local.
  const IndexRange q_rows{local_.first_q_head * D, local_.q_heads * D};
  const IndexRange kv_rows{local_.first_kv_head * D, local_.kv_heads * D};
  const HostTensor q_w = slice_rows(h.q_w, q_rows), k_w = slice_rows(h.k_w, kv_rows), v_w = slice_rows(h.v_w, kv_rows);
  const HostTensor q_b = slice_rows(h.q_b, q_rows), k_b = slice_rows(h.k_b, kv_rows), v_b = slice_rows(h.v_b, kv_rows);
  const bool whole_heads = shard_.tp_size == 1;
  LayerWeights w;
  w.attn_norm = backend_.upload(h.attn_norm);
  const HostTensor* qkv_w[] = {&q_w, &k_w, &v_w};
  const HostTensor* qkv_b[] = {&q_b, &k_b, &v_b};
  w.qkv_w = backend_.upload_linear(qkv_w);  // q, k and v each on their own block grid
  w.qkv_b = backend_.upload_concat_rows(qkv_b);
  // o_proj is row-parallel: this rank's input columns; the partial outputs are summed by all-reduce.
  const HostTensor o_w = whole_heads ? h.o_w : slice_columns(h.o_w, q_rows, keep);
  const HostTensor* o_parts[] = {&o_w};
  w.o_w = backend_.upload_linear(o_parts);
  if (shard_.tp_rank == 0) w.o_b = backend_.upload(h.o_b);  // the sum of the ranks' outputs gets it once
  w.sinks = backend_.upload(slice_rows(h.sinks, {local_.first_q_head, local_.q_heads}));
  w.mlp_norm = backend_.upload(h.mlp_norm);
  w.router_w = backend_.upload(h.router_w);  // replicated: every rank routes every token
  w.router_b = backend_.upload(h.router_b);
  // Experts: a contiguous expert range, and within it a slice j in [j0, j1) of the intermediate
  // dimension: gate_up rows 2j (gate) and 2j+1 (up) are interleaved, so the slice is rows
  // [2 j0, 2 j1); down_proj is row-parallel over columns [j0, j1), its bias added by one slice only.
  const IndexRange experts{local_.first_expert, local_.experts};
  const IndexRange inter{local_.first_intermediate, local_.intermediate};
  if (experts.count == E && inter.count == I) {
    w.experts = backend_.upload_experts(h.gate_up, h.down);
  } else {
    const HostExperts gate_up =
        slice_experts(h.gate_up, experts, {2 * inter.begin, 2 * inter.count}, {0, H}, false, keep);
    const HostExperts down = slice_experts(h.down, experts, {0, H}, inter, shard_.expert_tp_rank != 0, keep);
    w.experts = backend_.upload_experts(gate_up, down);
  }
  w.experts.first_expert = local_.first_expert;
  w.experts.global_experts = E;
  weights_.layers.push_back(std::move(w));
}

void GptOssModel::set_capture_layers(std::vector<int> layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    OSSRT_CHECK(layers[i] >= 0 && layers[i] < config_.num_layers,
                "hidden-state capture: layer {} outside the model's {} layers [0, {})", layers[i], config_.num_layers,
                config_.num_layers);
    OSSRT_CHECK(std::find(layers.begin(), layers.begin() + ptrdiff_t(i), layers[i]) == layers.begin() + ptrdiff_t(i),
                "hidden-state capture: layer {} listed twice", layers[i]);
  }
  // Buffers are planned once here, like the workspaces: a step never allocates.
  while (captures_.size() < layers.size())
    captures_.push_back(backend_.alloc(backend_.residual_dtype(), {limits_.max_step_tokens, config_.hidden_size}));
  capture_layers_ = std::move(layers);
  captured_rows_ = 0;
}

Tensor GptOssModel::captured(size_t i) const {
  OSSRT_CHECK(i < capture_layers_.size(), "hidden-state capture: no capture {} ({} layers captured)", i,
              capture_layers_.size());
  return captures_[i].rows(0, captured_rows_);
}

void GptOssModel::capture_layer_output(int layer, const Tensor& x) {
  for (size_t i = 0; i < capture_layers_.size(); ++i) {
    if (capture_layers_[i] != layer) continue;
    Tensor dst = captures_[i].rows(0, x.dim(0));
    backend_.copy(x, dst);
    captured_rows_ = x.dim(0);
  }
}

Tensor GptOssModel::run_step(const StepPlan& plan) {
  Tensor logits = backend_.run_step(plan, [this](const StepPlan& p) { return forward(p); });
  // A replayed graph copied the padded plan's rows; the plan's own rows come first.
  if (!capture_layers_.empty()) captured_rows_ = plan.num_tokens();
  return logits;
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
  Tensor x = ws.residual.rows(0, T), x_alt = ws.residual_alt.rows(0, T);
  Tensor normed = ws.normed.rows(0, T), qkv = ws.qkv.rows(0, T);
  Tensor attn = ws.attn.rows(0, T), attn_out = ws.attn_out.rows(0, T);
  Tensor moe_out;  // the previous layer's MoE output, which the next layer adds to the residual

  backend_.begin_step(plan);
  moe_->begin_step(T);
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
    ap.num_q_heads = local_.q_heads;
    ap.num_kv_heads = local_.kv_heads;
    ap.head_dim = c.head_dim;
    ap.sm_scale = float(1.0 / std::sqrt(double(c.head_dim)));

    // x += MoE output of the previous layer (fused with the norm); layer 0 starts from the embedding.
    if (observer_) {  // each op on its own, to observe the norm and the projection before the rotation
      if (l == 0)
        backend_.rmsnorm(x, w.attn_norm, eps, normed);
      else
        backend_.add_rmsnorm(x, moe_out, w.attn_norm, eps, normed);
      observe(name + ".attn_in", normed);
      backend_.linear(normed, w.qkv_w, &w.qkv_b, qkv);
      observe(name + ".qkv", qkv);
      backend_.rope_and_cache_write(qkv, rope_, ap);
    } else if (l == 0) {
      backend_.rmsnorm(x, w.attn_norm, eps, normed);
      backend_.qkv_rope_cache_write(normed, w.qkv_w, &w.qkv_b, rope_, ap, qkv);
    } else {
      // Out of place, so a backend may fold the norm into the projection (backend.h).
      backend_.add_rmsnorm_qkv_rope_cache_write(x, moe_out, x_alt, w.attn_norm, eps, normed, w.qkv_w, &w.qkv_b, rope_,
                                                ap, qkv);
      std::swap(x, x_alt);
    }
    capture_layer_output(l - 1, x);  // x is now layer l - 1's output
    observe(name + ".qkv_rope", qkv);
    backend_.attention(qkv, w.sinks, ap, attn);
    observe(name + ".attn", attn);
    // o_proj is row-parallel over the heads: each rank's output is its heads' share of the sum.
    backend_.linear(attn, w.o_w, w.o_b.empty() ? nullptr : &w.o_b, attn_out);
    all_reduce_sum(shard_.tp, attn_out);
    observe(name + ".attn_out", attn_out);

    // The MoE block runs the norm (x += attn_out; normed = rmsnorm(x)), so it can fold it into its router.
    moe_out = moe_->run(MoeInput{x, attn_out, w.mlp_norm, eps, normed}, w.router_w, w.router_b, w.experts, swiglu,
                        [&](const std::string& what, const Tensor& t) { observe(name + "." + what, t); });
    observe(name + ".mlp_in", normed);
    observe(name + ".moe_out", moe_out);
  }
  backend_.add(x, moe_out);
  capture_layer_output(c.num_layers - 1, x);
  observe("residual", x);

  Tensor logit_in = ws.logit_in.rows(0, R), final_norm = ws.final_norm.rows(0, R), logits = ws.logits.rows(0, R);
  Tensor lm_head_out = ws.lm_head_out.rows(0, R);
  backend_.gather_logit_rows(x, logit_in);
  backend_.rmsnorm(logit_in, weights_.final_norm, eps, final_norm);
  observe("final_norm", final_norm);
  // Vocab-parallel unembedding: this rank's vocab rows, then every rank's columns side by side. On one
  // rank the logits are the step's own, so the backend may fold greedy decoding's argmax into it.
  if (shard_.tp_size == 1)
    backend_.unembed(final_norm, weights_.lm_head, lm_head_out);
  else
    backend_.linear(final_norm, weights_.lm_head, nullptr, lm_head_out);
  all_gather_columns(shard_.tp, lm_head_out, logits);
  observe("logits", logits);
  return logits;
}

}  // namespace ossrt
