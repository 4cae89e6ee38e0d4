// The per-step ops of the CUDA backend: argument checks on the host (cheap, and the only place a
// bad shape can be reported clearly), then one launcher or cuBLASLt call on the backend's stream.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/cublas_fp8.h"
#include "backend/cuda/cublas_linear.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_graphs.h"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/embedding.cuh"
#include "backend/cuda/kernels/fp8_linear.cuh"
#include "backend/cuda/kernels/gather.cuh"
#include "backend/cuda/kernels/gemv.cuh"
#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/norm.cuh"
#include "backend/cuda/kernels/rope_cache.cuh"
#include "backend/cuda/kernels/router.cuh"
#include "backend/cuda/plan_upload.h"

namespace ossrt {
namespace {

// FP8 linears of at least this many token rows quantize their activation in a kernel of its own.
constexpr int kFp8PrequantizeRows = 4;

void check_on_device(const Tensor& t, const char* op, const char* what) {
  OSSRT_CHECK(t.device == Device::CUDA && t.data != nullptr, "{}: {} is not a CUDA tensor", op, what);
}

void check_float(const Tensor& t, const char* op, const char* what) {
  check_on_device(t, op, what);
  OSSRT_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "{}: {} has dtype {}, expected f32 or bf16", op, what,
              dtype_name(t.dtype));
}

cuda::RowsRef rows_ref(const Tensor& t) { return {t.data, t.dtype == DType::F32}; }

// Whether two tensors share a byte (a kernel that writes one while other CTAs read the other needs not).
bool bytes_overlap(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const uint8_t*>(a.data);
  const auto* pb = static_cast<const uint8_t*>(b.data);
  return pa < pb + b.bytes() && pb < pa + a.bytes();
}

// The fused add + norm's arguments, checked: residual_out = residual + delta (into residual itself
// when residual_out is null), out = rmsnorm(residual_out) * w.
cuda::RmsNormArgs add_rmsnorm_args(const Tensor& residual, const Tensor& delta, Tensor* residual_out, const Tensor& w,
                                   float eps, const Tensor& out, const char* op) {
  check_on_device(residual, op, "residual");
  OSSRT_CHECK(residual.dtype == DType::F32, "{}: the residual stream must be f32", op);
  check_float(delta, op, "delta");
  check_float(w, op, "w");
  check_float(out, op, "out");
  const int64_t h = w.numel();
  const int64_t rows = residual.dim(0);
  OSSRT_CHECK(residual.row_elems() == h && delta.row_elems() == h && out.row_elems() == h && delta.dim(0) >= rows &&
                  out.dim(0) >= rows,
              "{}: residual {} / delta {} / w {} / out {} disagree", op, residual.shape_str(), delta.shape_str(),
              w.shape_str(), out.shape_str());
  if (residual_out) {
    check_on_device(*residual_out, op, "residual_out");
    OSSRT_CHECK(residual_out->dtype == DType::F32 && residual_out->row_elems() == h && residual_out->dim(0) >= rows,
                "{}: residual_out {} {} for residual {}", op, dtype_name(residual_out->dtype),
                residual_out->shape_str(), residual.shape_str());
  }
  cuda::RmsNormArgs a{{nullptr, true},
                      residual.ptr<float>(),
                      rows_ref(delta),
                      rows_ref(w),
                      out.data,
                      out.dtype == DType::F32,
                      int(rows),
                      int(h),
                      eps,
                      residual_out ? residual_out->ptr<float>() : nullptr,
                      {}};
  return a;
}

// Rows of a [rows, features] activation, checked against the step's token count.
int64_t step_rows(const Tensor& t, int expected, const char* op, const char* what) {
  OSSRT_CHECK(t.ndim >= 1 && t.dim(0) >= expected, "{}: {} {} has fewer than the step's {} rows", op, what,
              t.shape_str(), expected);
  return expected;
}

}  // namespace

void CudaBackend::embedding(const Tensor& table, Tensor& out) {
  bind_device();
  check_on_device(table, "embedding", "table");
  check_float(out, "embedding", "out");
  OSSRT_CHECK(table.dtype == DType::BF16 && table.ndim == 2, "embedding: table must be bf16 [V, H], got {} {}",
              dtype_name(table.dtype), table.shape_str());
  const StepPlan& plan = plan_->host_plan();
  const int t = plan.num_tokens();
  step_rows(out, t, "embedding", "out");
  OSSRT_CHECK(out.row_elems() == table.dim(1), "embedding: out {} vs table {}", out.shape_str(), table.shape_str());
  for (int32_t id : plan.token_ids)
    OSSRT_CHECK(id >= 0 && id < table.dim(0), "embedding: token id {} outside the vocabulary [0, {})", id,
                table.dim(0));
  cuda::EmbeddingGatherArgs a{static_cast<const __nv_bfloat16*>(table.data),
                              plan_->device_plan().token_ids,
                              out.data,
                              t,
                              int(table.dim(1)),
                              out.dtype == DType::F32};
  OSSRT_CUDA_CHECK(cuda::launch_bf16_embedding_gather(a, stream_));
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  bind_device();
  if (ablated(kAblateNorm)) return;
  check_float(x, "rmsnorm", "x");
  check_float(w, "rmsnorm", "w");
  check_float(out, "rmsnorm", "out");
  const int64_t h = w.numel();
  OSSRT_CHECK(x.row_elems() == h && out.row_elems() == h && out.dim(0) >= x.dim(0),
              "rmsnorm: x {} / w {} / out {} disagree", x.shape_str(), w.shape_str(), out.shape_str());
  cuda::RmsNormArgs a{
      rows_ref(x), nullptr, {nullptr, true}, rows_ref(w), out.data, out.dtype == DType::F32, int(x.dim(0)),
      int(h),      eps,     nullptr,         {}};
  OSSRT_CUDA_CHECK(cuda::launch_f32_rmsnorm(a, stream_));
}

void CudaBackend::add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& w, float eps, Tensor& out) {
  bind_device();
  if (ablated(kAblateNorm)) return;
  OSSRT_CUDA_CHECK(
      cuda::launch_f32_rmsnorm(add_rmsnorm_args(residual, delta, nullptr, w, eps, out, "add_rmsnorm"), stream_));
}

void CudaBackend::add(Tensor& residual, const Tensor& delta) {
  bind_device();
  check_on_device(residual, "add", "residual");
  OSSRT_CHECK(residual.dtype == DType::F32, "add: the residual stream must be f32");
  check_float(delta, "add", "delta");
  OSSRT_CHECK(delta.row_elems() == residual.row_elems() && delta.dim(0) >= residual.dim(0),
              "add: residual {} / delta {} disagree", residual.shape_str(), delta.shape_str());
  cuda::RmsNormArgs a{{nullptr, true},
                      residual.ptr<float>(),
                      rows_ref(delta),
                      {nullptr, true},
                      nullptr,
                      true,
                      int(residual.dim(0)),
                      int(residual.row_elems()),
                      0.f,
                      nullptr,
                      {}};
  OSSRT_CUDA_CHECK(cuda::launch_f32_rmsnorm(a, stream_));
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  bind_device();
  check_float(src, "copy", "src");
  check_float(dst, "copy", "dst");
  OSSRT_CHECK(src.numel() == dst.numel(), "copy: src {} and dst {} differ", src.shape_str(), dst.shape_str());
  if (src.numel() == 0) return;
  if (src.dtype == dst.dtype) {
    OSSRT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  const cuda::ConvertArgs a{src.data, dst.data, src.numel(), src.dtype == DType::F32};
  OSSRT_CUDA_CHECK(cuda::launch_convert_f32_bf16(a, stream_));
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  bind_device();
  if (ablated(w.dim(0) > 65536 ? kAblateLmHead : kAblateLinear)) return;  // the unembedding: vocab rows
  if (out.data == fused_greedy_.logits) fused_greedy_ = {};               // new values: the fused ids no longer hold
  run_linear(x, w, bias, out, nullptr);
}

void CudaBackend::unembed(const Tensor& x, const Tensor& w, Tensor& logits) {
  bind_device();
  fused_greedy_ = {};
  if (ablated(w.dim(0) > 65536 ? kAblateLmHead : kAblateLinear)) return;  // linear()'s rule
  const int64_t rows = x.ndim == 2 ? x.dim(0) : 0;
  // A one-row greedy-only step: the screen finds the id without the logits (kernels/greedy_screen.cuh).
  const auto screen = greedy_screens_.find(w.data);
  if (screen != greedy_screens_.end() && rows == 1 && plan_->host_plan().greedy_ids_only) {
    const cuda::GreedyScreenWeights& g = screen->second->weights;
    check_on_device(x, "unembed", "x");
    check_float(logits, "unembed", "logits");
    OSSRT_CHECK(x.dtype == DType::BF16 && x.row_elems() == g.k && logits.dtype == DType::F32 && logits.ndim == 2 &&
                    logits.row_elems() == g.n,
                "unembed: x {} {} / logits {} {} for the screened unembedding [{}, {}]", dtype_name(x.dtype),
                x.shape_str(), dtype_name(logits.dtype), logits.shape_str(), g.n, g.k);
    const cuda::GreedyArgmaxArgs keys{greedy_keys_, greedy_ids_, 1};
    try {
      cuda::launch_greedy_screen(g, screen->second->state, static_cast<const uint16_t*>(x.data), keys, num_sms_,
                                 stream_);
    } catch (...) {  // launched in part: the next step's keys and counters start clean
      cudaMemsetAsync(greedy_keys_, 0, cuda::greedy_argmax_key_bytes(), stream_);
      cudaMemsetAsync(screen->second->state.words, 0, cuda::kGreedyScreenWords * sizeof(uint32_t), stream_);
      throw;
    }
    fused_greedy_ = {logits.data, 1, g.n, false, /*logits_written=*/false};
    if (!graphs_->capturing()) ++greedy_screen_steps_;  // a capture launches nothing
    return;
  }
  const bool fuse = fused_greedy_enabled_ && logits.dtype == DType::F32 && logits.ndim == 2 && rows >= 1 &&
                    rows <= cuda::kGreedyMaxRows && logits.row_elems() < (int64_t(1) << 31);
  const cuda::GreedyArgmaxArgs greedy{greedy_keys_, greedy_ids_, int(rows)};
  // Larger steps, cuBLASLt's shapes and the OSSRT_CUDA_GEMV_MAX_ROWS=0 A/B run linear() alone.
  if (!run_linear(x, w, nullptr, logits, fuse ? &greedy : nullptr)) return;
  try {
    cuda::launch_greedy_argmax_finish(greedy, stream_);
  } catch (...) {
    cudaMemsetAsync(greedy_keys_, 0, cuda::greedy_argmax_key_bytes(), stream_);  // the next GEMV's keys start clean
    throw;
  }
  fused_greedy_ = {logits.data, rows, logits.row_elems(), false};
}

std::vector<uint32_t> CudaBackend::greedy_screen_words(const Tensor& w) {
  bind_device();
  const auto screen = greedy_screens_.find(w.data);
  if (screen == greedy_screens_.end()) return {};
  std::vector<uint32_t> words(cuda::kGreedyScreenWords);
  OSSRT_CUDA_CHECK(cudaMemcpyAsync(words.data(), screen->second->state.words, words.size() * sizeof(uint32_t),
                                   cudaMemcpyDeviceToHost, stream_));
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return words;
}

bool CudaBackend::run_linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                             const cuda::GreedyArgmaxArgs* greedy) {
  check_on_device(x, "linear", "x");
  check_on_device(w, "linear", "w");
  check_float(out, "linear", "out");
  if (w.dtype == DType::FP8_E4M3) {
    const auto it = fp8_weights_.find(w.data);
    OSSRT_CHECK(it != fp8_weights_.end(), "linear: an fp8 weight {} that upload_linear did not make", w.shape_str());
    return fp8_linear(x, w, *it->second, bias, out, greedy);
  }
  OSSRT_CHECK(x.dtype == DType::BF16 && w.dtype == DType::BF16, "linear: x and w must be bf16 (got {} / {})",
              dtype_name(x.dtype), dtype_name(w.dtype));
  OSSRT_CHECK(w.ndim == 2 && x.row_elems() == w.dim(1) && out.row_elems() == w.dim(0) && out.dim(0) >= x.dim(0),
              "linear: x {} / w {} / out {} disagree", x.shape_str(), w.shape_str(), out.shape_str());
  if (bias) {
    check_on_device(*bias, "linear", "bias");
    OSSRT_CHECK(bias->dtype == DType::BF16 && bias->numel() == w.dim(0), "linear: bias {} {} for w {}",
                dtype_name(bias->dtype), bias->shape_str(), w.shape_str());
  }
  // Decode sizes: our GEMV (one launch, bias in the epilogue, no split-K reduce); cuBLASLt otherwise.
  cuda::GemvArgs g{static_cast<const uint16_t*>(x.data),
                   static_cast<const uint16_t*>(w.data),
                   bias ? static_cast<const uint16_t*>(bias->data) : nullptr,
                   out.data,
                   out.dtype == DType::F32,
                   int(x.dim(0)),
                   int(w.dim(0)),
                   int(w.dim(1))};
  if (x.dim(0) <= gemv_max_rows_ && cuda::gemv_supported(g)) {
    if (greedy) g.greedy = *greedy;
    cuda::launch_bf16_gemv(g, num_sms_, stream_);
    return greedy != nullptr;
  }
  blas_->matmul(x.data, w.data, bias ? bias->data : nullptr, out.data, x.dim(0), w.dim(0), w.dim(1),
                out.dtype == DType::F32, stream_);
  return false;
}

CudaBackend::Fp8BlasRows CudaBackend::fp8_blas_rows(int64_t m, const Fp8Weight& f, const Tensor* bias,
                                                    const Tensor& out) const {
  // Prefill sizes: cuBLASLt's block-scaled matmul on the first m - m % 4 rows (its activation scale
  // tensor is then a whole multiple of 4 rows), our GEMV on the last 0-3. Only where one GEMM over
  // the fused weight is each part's own (grid_aligned) and cuBLASLt has an algorithm for the shape.
  // Where cuBLASLt takes no bias epilogue with block scales, it runs without and a kernel adds it.
  Fp8BlasRows r;
  r.m4 = m / 4 * 4;
  const bool out_f32 = out.dtype == DType::F32;
  const bool blas = m > cuda::kFp8GemvMaxRows && f.grid_aligned && blas_fp8_ && blas_fp8_->enabled();
  r.blas_bias = blas && blas_fp8_->ready(r.m4, f.n, f.k_pad, out_f32, bias != nullptr, out.data);
  r.blas_then_bias =
      blas && !r.blas_bias && bias && !out_f32 && blas_fp8_->ready(r.m4, f.n, f.k_pad, out_f32, false, out.data);
  if (r.blas_bias || r.blas_then_bias) {
    r.token_major = blas_fp8_->layout().act_token_major;
    r.chunk_rows = int(blas_fp8_->chunk_rows(r.m4, f.n, out_f32));
  }
  return r;
}

bool CudaBackend::fp8_linear(const Tensor& x, const Tensor& w, const Fp8Weight& f, const Tensor* bias, Tensor& out,
                             const cuda::GreedyArgmaxArgs* greedy, bool x_codes_ready) {
  OSSRT_CHECK(x.dtype == DType::BF16, "linear: x must be bf16 (got {})", dtype_name(x.dtype));
  OSSRT_CHECK(x.row_elems() == f.k && out.row_elems() == f.n && out.dim(0) >= x.dim(0),
              "linear: x {} / fp8 w [{}, {}] / out {} disagree", x.shape_str(), f.n, f.k, out.shape_str());
  if (bias) {
    check_on_device(*bias, "linear", "bias");
    OSSRT_CHECK(bias->dtype == DType::BF16 && bias->numel() == f.n, "linear: bias {} {} for fp8 w [{}, {}]",
                dtype_name(bias->dtype), bias->shape_str(), f.n, f.k);
  }
  const int64_t m = x.dim(0);
  if (m == 0) return false;
  const bool out_f32 = out.dtype == DType::F32;
  const auto* codes = static_cast<const uint8_t*>(w.data);
  cuda::Fp8GemvArgs g{static_cast<const uint16_t*>(x.data),
                      codes,
                      f.scales,
                      bias ? static_cast<const uint16_t*>(bias->data) : nullptr,
                      out.data,
                      out_f32,
                      int(m),
                      f.n,
                      f.k,
                      f.k_pad,
                      f.parts};
  if (fp8_gemv_split_) g.split_partials = fp8_split_partials_, g.split_tickets = fp8_split_tickets_;
  const Fp8BlasRows rows = fp8_blas_rows(m, f, bias, out);
  const int64_t m4 = rows.m4;
  const bool blas_bias = rows.blas_bias, blas_then_bias = rows.blas_then_bias;
  OSSRT_CHECK(!x_codes_ready || blas_bias || blas_then_bias,
              "linear: the activation codes were written for a cuBLASLt matmul this shape does not take");
  if (blas_bias || blas_then_bias) {
    OSSRT_CHECK(m4 <= options_.max_step_tokens && f.k_pad <= fp8_act_k_pad_,
                "linear: {} rows x k_pad {} exceed the FP8 workspace ({} tokens x {})", m4, f.k_pad,
                options_.max_step_tokens, fp8_act_k_pad_);
    // (x_codes_ready: the norm that made x wrote these codes and scales, add_rmsnorm_qkv_rope_cache_write.)
    cuda::Fp8QuantizeArgs q{g.x,
                            static_cast<uint8_t*>(fp8_act_codes_),
                            fp8_act_scales_,
                            int(m4),
                            f.k,
                            f.k_pad,
                            rows.token_major,
                            rows.chunk_rows};
    if (!x_codes_ready) cuda::launch_bf16_fp8_quantize_rows(q, stream_);
    const bool ran =
        blas_fp8_->matmul(static_cast<const uint8_t*>(fp8_act_codes_), fp8_act_scales_, codes, f.blas_scales,
                          blas_bias && bias ? bias->data : nullptr, out.data, m4, f.n, f.k_pad, out_f32, stream_);
    OSSRT_CHECK(ran, "linear: cuBLASLt refused an FP8 shape it had an algorithm for");
    if (blas_then_bias)
      cuda::launch_bf16_add_bias_rows({out.data, static_cast<const uint16_t*>(bias->data), int(m4), f.n}, stream_);
    if (m4 == m) return false;
    g.x += m4 * f.k;
    g.out = static_cast<char*>(out.data) + size_t(m4) * size_t(f.n) * (out_f32 ? 4 : 2);
    g.m = int(m - m4);
    greedy = nullptr;  // the GEMV below sees only the last rows
  }
  // From 4 rows on (and where cuBLASLt does not serve more than 8): quantized once here, then our
  // tensor-core GEMV (by groups of 8 rows, grid.y) copies its rows' codes. Each CTA quantizing its
  // own rows cost 17 / 28 us for QKV at 4 / 8 rows on the H200 (15a0c3b; 9 us at one row).
  if (g.m >= kFp8PrequantizeRows && g.m <= options_.max_step_tokens && f.k_pad <= fp8_act_k_pad_) {
    cuda::Fp8QuantizeArgs q{g.x, static_cast<uint8_t*>(fp8_act_codes_), fp8_act_scales_, g.m, f.k, f.k_pad, false, g.m};
    cuda::launch_bf16_fp8_quantize_rows(q, stream_);
    g.x_codes = static_cast<const uint8_t*>(fp8_act_codes_);
    g.x_scales = fp8_act_scales_;
  }
  // Decode sizes: our GEMV (1-3 rows: one launch, the activation quantized by each CTA).
  if (greedy && g.m > cuda::kGreedyMaxRows) greedy = nullptr;
  if (greedy) g.greedy = *greedy;
  cuda::launch_bf16_fp8w_gemv(g, num_sms_, fp8_mma_from_rows_, stream_);
  return greedy != nullptr;
}

cuda::RopeCacheWriteArgs CudaBackend::rope_cache_args(Tensor& qkv, const RopeParams& rope, const AttentionParams& p) {
  check_on_device(qkv, "rope_and_cache_write", "qkv");
  const StepPlan& plan = plan_->host_plan();
  const int t = plan.num_tokens();
  OSSRT_CHECK(p.head_dim == cuda::kRopeHeadDim && rope.inv_freq.size() == size_t(cuda::kRopeHalf),
              "rope_and_cache_write: head_dim {} with {} frequencies; the CUDA path supports head_dim 64", p.head_dim,
              rope.inv_freq.size());
  OSSRT_CHECK(qkv.dtype == DType::BF16 && qkv.row_elems() == int64_t(p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim,
              "rope_and_cache_write: qkv {} {} does not match {} q + {} kv heads", dtype_name(qkv.dtype),
              qkv.shape_str(), p.num_q_heads, p.num_kv_heads);
  step_rows(qkv, t, "rope_and_cache_write", "qkv");
  const KvStorage& kv = kv_storage(p.group);
  const KvStorage::Group& g = kv.group(p.group);
  OSSRT_CHECK(p.layer_in_group >= 0 && size_t(p.layer_in_group) < g.k.size(),
              "rope_and_cache_write: layer {} of the {} group, which has {} layers", p.layer_in_group,
              p.group == KvGroup::Full ? "full" : "sliding", g.k.size());
  OSSRT_CHECK(p.num_kv_heads == kv.shape.num_kv_heads, "rope_and_cache_write: {} kv heads, cache has {}",
              p.num_kv_heads, kv.shape.num_kv_heads);
  const cuda::DevicePlan& dp = plan_->device_plan();
  cuda::RopeCacheWriteArgs a{};
  a.qkv = static_cast<__nv_bfloat16*>(qkv.data);
  a.positions = dp.positions;
  a.slots = p.group == KvGroup::Full ? dp.full_slots : dp.window_slots;
  set_layer_cache(a, kv, p.group, p.layer_in_group);
  a.num_tokens = t;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.block_size = kv.shape.block_size;
  std::copy(rope.inv_freq.begin(), rope.inv_freq.end(), a.inv_freq);
  a.concentration = rope.concentration;
  return a;
}

void CudaBackend::rope_and_cache_write(Tensor& qkv, const RopeParams& rope, const AttentionParams& p) {
  bind_device();
  OSSRT_CUDA_CHECK(cuda::launch_bf16_rope_kv_cache_write(rope_cache_args(qkv, rope, p), stream_));
}

bool CudaBackend::bf16_qkv_rope_fusable(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& qkv) const {
  // Only where the one-row GEMV takes a warp per row, the arithmetic the fused kernel repeats.
  const bool one_token = plan_->host_plan().num_tokens() == 1 && x.dim(0) == 1 && gemv_max_rows_ >= 1 &&
                         w.dtype == DType::BF16 && w.ndim == 2 && cuda::gemv_one_warp_per_row(int(w.dim(0)), num_sms_);
  return one_token && x.dtype == DType::BF16 && qkv.dtype == DType::BF16 && x.row_elems() == w.dim(1) &&
         qkv.row_elems() == w.dim(0) && (!bias || (bias->dtype == DType::BF16 && bias->numel() == w.dim(0)));
}

void CudaBackend::qkv_rope_cache_write(const Tensor& x, const Tensor& w, const Tensor* bias, const RopeParams& rope,
                                       const AttentionParams& p, Tensor& qkv) {
  bind_device();
  if (ablated(kAblateQkv)) return;
  // One-token steps (batch-1 decode): the projection, rotation and cache write in one kernel, with
  // the arithmetic of the one-row GEMV and the RoPE kernel. Otherwise the two ops.
  const bool one_token_step = plan_->host_plan().num_tokens() == 1 && x.dim(0) == 1;
  if (w.dtype == DType::FP8_E4M3) {
    // FP8 weights: only where the one-row linear is the tensor-core GEMV (fp8_mma_from_rows_ 1, the
    // default), whose arithmetic the fused kernel repeats; OSSRT_CUDA_FP8_QKV_ROPE=0 turns it off.
    const auto it = fp8_weights_.find(w.data);
    OSSRT_CHECK(it != fp8_weights_.end(), "qkv_rope_cache_write: an fp8 weight {} that upload_linear did not make",
                w.shape_str());
    const Fp8Weight& f = *it->second;
    const bool shapes = x.dtype == DType::BF16 && qkv.dtype == DType::BF16 && x.row_elems() == f.k &&
                        qkv.row_elems() == f.n && (!bias || (bias->dtype == DType::BF16 && bias->numel() == f.n));
    if (one_token_step && fp8_qkv_rope_ && fp8_mma_from_rows_ <= 1 && shapes) {
      check_on_device(x, "qkv_rope_cache_write", "x");
      if (bias) check_on_device(*bias, "qkv_rope_cache_write", "bias");
      cuda::Fp8QkvRopeArgs q{{static_cast<const uint16_t*>(x.data), static_cast<const uint8_t*>(w.data), f.scales,
                              bias ? static_cast<const uint16_t*>(bias->data) : nullptr, qkv.data,
                              /*out_f32=*/false, 1, f.n, f.k, f.k_pad, f.parts},
                             rope_cache_args(qkv, rope, p)};
      if (fp8_gemv_split_) q.linear.split_partials = fp8_split_partials_, q.linear.split_tickets = fp8_split_tickets_;
      if (cuda::fp8_qkv_rope_supported(q)) {
        cuda::launch_bf16_fp8w_gemv_qkv_rope_kv_write(q, num_sms_, stream_);
        ++fused_qkv_rope_launches_;
        return;
      }
    }
    Backend::qkv_rope_cache_write(x, w, bias, rope, p, qkv);
    return;
  }
  if (!bf16_qkv_rope_fusable(x, w, bias, qkv)) {
    Backend::qkv_rope_cache_write(x, w, bias, rope, p, qkv);
    return;
  }
  check_on_device(x, "qkv_rope_cache_write", "x");
  check_on_device(w, "qkv_rope_cache_write", "w");
  if (bias) check_on_device(*bias, "qkv_rope_cache_write", "bias");
  const cuda::QkvRopeArgs f{static_cast<const uint16_t*>(x.data), static_cast<const uint16_t*>(w.data),
                            bias ? static_cast<const uint16_t*>(bias->data) : nullptr, int(w.dim(1)),
                            rope_cache_args(qkv, rope, p)};
  if (!cuda::qkv_rope_fused_supported(f)) {
    Backend::qkv_rope_cache_write(x, w, bias, rope, p, qkv);
    return;
  }
  cuda::launch_bf16_gemv_qkv_rope_kv_write(f, stream_);
  ++fused_qkv_rope_launches_;
}

void CudaBackend::add_rmsnorm_qkv_rope_cache_write(const Tensor& residual, const Tensor& delta, Tensor& residual_out,
                                                   const Tensor& norm_w, float eps, Tensor& normed, const Tensor& w,
                                                   const Tensor* bias, const RopeParams& rope, const AttentionParams& p,
                                                   Tensor& qkv) {
  bind_device();
  constexpr const char* kOp = "add_rmsnorm_qkv_rope_cache_write";
  // CTA 0 of the folded kernel (and each row of the norm kernel) writes residual_out while others still
  // read residual and delta: no byte of it may be theirs.
  OSSRT_CHECK(!bytes_overlap(residual_out, residual) && !bytes_overlap(residual_out, delta),
              "{}: residual_out overlaps residual or delta", kOp);
  const cuda::RmsNormArgs norm = add_rmsnorm_args(residual, delta, &residual_out, norm_w, eps, normed, kOp);
  // One-token steps with bf16 weights, where qkv_rope_cache_write would take the fused kernel: the
  // norm in its prologue (rope_cache.cuh, QkvRopeArgs::fold_norm), the same bits as the two kernels.
  if (qkv_norm_fold_ && !ablated(kAblateNorm) && !ablated(kAblateQkv) && bf16_qkv_rope_fusable(normed, w, bias, qkv)) {
    check_on_device(w, kOp, "w");
    if (bias) check_on_device(*bias, kOp, "bias");
    cuda::QkvRopeArgs f{nullptr,
                        static_cast<const uint16_t*>(w.data),
                        bias ? static_cast<const uint16_t*>(bias->data) : nullptr,
                        int(w.dim(1)),
                        rope_cache_args(qkv, rope, p),
                        /*fold_norm=*/true,
                        norm};
    if (cuda::qkv_rope_fused_supported(f)) {
      cuda::launch_bf16_gemv_qkv_rope_kv_write(f, stream_);
      ++fused_qkv_rope_launches_;
      ++folded_qkv_norm_launches_;
      return;
    }
  }
  // FP8 weights on cuBLASLt's matmul (prefill sizes): the norm writes its output's FP8 codes too (the
  // quantizer's arithmetic and layout), and the linear skips its quantizer; the same bits.
  if (w.dtype == DType::FP8_E4M3 && fp8_norm_codes_ && !ablated(kAblateNorm) && !ablated(kAblateQkv) &&
      !ablated(kAblateLinear) && normed.dtype == DType::BF16 && qkv.dtype == DType::BF16) {
    const auto it = fp8_weights_.find(w.data);
    OSSRT_CHECK(it != fp8_weights_.end(), "{}: an fp8 weight {} that upload_linear did not make", kOp, w.shape_str());
    const Fp8Weight& f = *it->second;
    const int64_t m = normed.dim(0);  // the linear's rows: the norm's only if they are the same
    const Fp8BlasRows rows = fp8_blas_rows(m, f, bias, qkv);
    cuda::RmsNormArgs coded = norm;
    coded.fp8 = {static_cast<uint8_t*>(fp8_act_codes_),
                 fp8_act_scales_,
                 int(rows.m4),
                 f.k_pad,
                 rows.token_major,
                 rows.chunk_rows};
    if ((rows.blas_bias || rows.blas_then_bias) && m == norm.rows && normed.row_elems() == f.k &&
        rows.m4 <= options_.max_step_tokens && f.k_pad <= fp8_act_k_pad_ && cuda::rmsnorm_fp8_codes_supported(coded)) {
      OSSRT_CUDA_CHECK(cuda::launch_f32_rmsnorm(coded, stream_));
      fp8_linear(normed, w, f, bias, qkv, nullptr, /*x_codes_ready=*/true);
      rope_and_cache_write(qkv, rope, p);
      ++fp8_norm_codes_launches_;
      return;
    }
  }
  if (ablated(kAblateNorm))
    copy(residual, residual_out);  // the ablated norm leaves the stream as it was, as add_rmsnorm does
  else
    OSSRT_CUDA_CHECK(cuda::launch_f32_rmsnorm(norm, stream_));
  qkv_rope_cache_write(normed, w, bias, rope, p, qkv);
}

int CudaBackend::attn_min_split_keys(int num_seqs) const {
  return attn_min_split_keys_ != 0 ? attn_min_split_keys_ : cuda::attention_decode_min_split_keys(num_seqs);
}

void CudaBackend::attention(const Tensor& qkv, const Tensor& sinks, const AttentionParams& p, Tensor& out) {
  bind_device();
  if (ablated(kAblateAttention)) return;
  check_on_device(qkv, "attention", "qkv");
  check_on_device(sinks, "attention", "sinks");
  check_on_device(out, "attention", "out");
  OSSRT_CHECK(sinks.dtype == DType::BF16 && sinks.numel() == p.num_q_heads, "attention: sinks {} {} for {} heads",
              dtype_name(sinks.dtype), sinks.shape_str(), p.num_q_heads);
  OSSRT_CHECK(out.dtype == DType::BF16 && out.row_elems() == int64_t(p.num_q_heads) * p.head_dim,
              "attention: out {} {} for {} heads", dtype_name(out.dtype), out.shape_str(), p.num_q_heads);
  const cuda::DevicePlan& dp = plan_->device_plan();
  step_rows(qkv, dp.num_tokens, "attention", "qkv");
  step_rows(out, dp.num_tokens, "attention", "out");
  const KvStorage& kv = kv_storage(p.group);
  const KvStorage::Group& g = kv.group(p.group);
  OSSRT_CHECK(p.layer_in_group >= 0 && size_t(p.layer_in_group) < g.k.size(), "attention: layer {} of a group of {}",
              p.layer_in_group, g.k.size());
  cuda::AttentionArgs a;
  a.plan = dp;
  a.sliding = p.group == KvGroup::Sliding;
  a.window = p.window;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.sm_scale = p.sm_scale;
  a.qkv = static_cast<const uint16_t*>(qkv.data);
  a.qkv_row_stride = qkv.row_elems();
  a.sinks = static_cast<const uint16_t*>(sinks.data);
  set_layer_cache(a, kv, p.group, p.layer_in_group);
  a.num_blocks = g.num_blocks;
  a.out = static_cast<uint16_t*>(out.data);
  // A step of short sequences (a verify step: 1 + k tokens each): each token row as a decode sequence
  // of its own (DevicePlan::token_seqs), split-KV over its own visible keys, instead of the prefill
  // kernel's one CTA per (sequence, KV head) streaming the whole context. The grid has every split
  // (verify graphs have no context bucket); a row's slices depend only on its own length, so its
  // attention is the one plain decoding computes for that position, bit for bit.
  const bool rows_as_seqs =
      dp.max_seq_tokens > 1 && dp.num_token_seqs == dp.num_tokens && attn_short_seqs_as_decode_ &&
      cuda::attention_decode_workspace_bytes(dp.num_tokens, p.num_q_heads, attn_max_splits_) <= attn_workspace_bytes_;
  if (rows_as_seqs) {
    a.plan.seqs = dp.token_seqs;
    a.plan.num_seqs = dp.num_tokens;
    a.plan.max_seq_tokens = 1;
    a.kv_after_wait = true;
    // The split size of the step's sequence count, not its row count: plain decoding of the same batch
    // slices each row's keys the same way, so a verified row's attention is plain decoding's bit for
    // bit (with the row count, 3+ sequences of 4 rows fell in another class than their plain steps).
    a.min_keys_per_split = attn_min_split_keys(dp.num_seqs);
    a.max_splits = attn_max_splits_;
    a.num_splits = a.max_splits;
  } else if (dp.max_seq_tokens == 1) {
    // Splits for the plan's max_context: each sequence slices its own keys by its own length, so
    // the result is batch-invariant. A captured decode graph sees max_context = its context bucket
    // (cuda_graphs.cpp), an upper bound of every context it replays with, so its grid stays valid;
    // short contexts do not launch the 32 x Hkv x seqs CTAs of the longest one. A sliding layer sees at
    // most `window` keys whatever the context, so its grid has only the splits those need: the idle
    // CTAs of a full layer's count cost ~0.45 us a launch at batch 1 (a window layer at 32k: 4.12 us
    // on 64 splits against 3.67 on one, attention_test DISABLED_DecodeTiming), and a sequence's slices do not change
    // (they depend on its own visible length, never above the window, once the grid has the splits it needs).
    a.min_keys_per_split = attn_min_split_keys(dp.num_seqs);
    a.max_splits = attn_max_splits_;
    const int visible = p.window > 0 ? std::min(dp.max_context, p.window) : dp.max_context;
    a.num_splits = cuda::attention_decode_splits(dp.num_seqs, p.num_kv_heads, visible, num_sms_, a.min_keys_per_split,
                                                 a.max_splits);
    OSSRT_CHECK(
        cuda::attention_decode_workspace_bytes(dp.num_seqs, p.num_q_heads, a.num_splits) <= attn_workspace_bytes_,
        "attention: decode workspace too small for {} sequences x {} heads", dp.num_seqs, p.num_q_heads);
  }
  // Otherwise (prefill chunks, verify steps) the prefill kernel's grid is the plan's num_seqs x
  // max_seq_tokens tiles, nothing of the context: a verify graph replays at any context length
  // (StepGraphCache::key).
  a.workspace = attn_workspace_;
  a.workspace_bytes = attn_workspace_bytes_;
  a.decode_ring = attn_decode_ring_ != 0
                      ? attn_decode_ring_
                      : cuda::attention_decode_ring(a.plan.num_seqs, a.num_kv_heads, a.num_splits, num_sms_, a.kv_elem);
  a.cache_split_blocks = attn_cache_split_blocks_;
  a.decode_plain_form = attn_decode_plain_form_;
  if (attn_fold_merge_) {
    a.tickets = attn_tickets_;
    a.tickets_capacity = attn_tickets_capacity_;
  }
  cuda::launch_bf16_sdpa_sinks_d64(a, stream_);
  OSSRT_CUDA_CHECK(cudaGetLastError());
}

cuda::RouterFusedArgs CudaBackend::router_args(const Tensor& x, const Tensor& w, const Tensor& b, int k, Tensor& ids,
                                               Tensor& weights, const char* op) const {
  check_on_device(x, op, "x");
  check_on_device(w, op, "w");
  check_float(b, op, "b");
  check_on_device(ids, op, "ids");
  check_on_device(weights, op, "weights");
  const int64_t t = x.dim(0), e = w.dim(0);
  OSSRT_CHECK(x.dtype == DType::BF16 && w.dtype == DType::BF16 && w.ndim == 2 && x.row_elems() == w.dim(1),
              "{}: x {} / w {} disagree (bf16 expected)", op, x.shape_str(), w.shape_str());
  OSSRT_CHECK(e <= cuda::kRouterMaxExperts && k >= 1 && k <= cuda::kRouterMaxTopK && k <= e && b.numel() == e,
              "{}: {} experts top-{} (bias {}); supported: up to {} experts, k up to {}", op, e, k, b.numel(),
              cuda::kRouterMaxExperts, cuda::kRouterMaxTopK);
  OSSRT_CHECK(ids.dtype == DType::I32 && weights.dtype == DType::F32 && ids.row_elems() == k &&
                  weights.row_elems() == k && ids.dim(0) >= t && weights.dim(0) >= t,
              "{}: ids {} {} / weights {} {} must be I32/F32 [T, {}]", op, dtype_name(ids.dtype), ids.shape_str(),
              dtype_name(weights.dtype), weights.shape_str(), k);
  OSSRT_CHECK(size_t(t * e) * sizeof(float) <= router_logits_bytes_, "{}: {} tokens exceed the planned {}", op, t,
              options_.max_step_tokens);
  return cuda::RouterFusedArgs{static_cast<const uint16_t*>(x.data),
                               static_cast<const uint16_t*>(w.data),
                               b.data,
                               b.dtype == DType::F32,
                               static_cast<float*>(router_logits_),
                               router_counter_,
                               ids.ptr<int32_t>(),
                               weights.ptr<float>(),
                               int(t),
                               int(e),
                               k,
                               int(w.dim(1))};
}

void CudaBackend::router_topk(const Tensor& x, const Tensor& w, const Tensor& b, int k, Tensor& ids, Tensor& weights) {
  route_rows(x, w, b, k, ids, weights, nullptr);
}

const int32_t* CudaBackend::step_real_tokens(int64_t rows) const {
  return moe_drop_padding_ && rows == plan_->host_plan().num_tokens() ? plan_->device_plan().real_tokens : nullptr;
}

void CudaBackend::route_rows(const Tensor& x, const Tensor& w, const Tensor& b, int k, Tensor& ids, Tensor& weights,
                             const int32_t* real_tokens) {
  bind_device();
  if (ablated(kAblateRouter)) return;
  // Router logits in fp32 (docs/reference/SPEC.md 2.6 recommends fp32 logits and softmax); the bias joins in the top-k
  // kernel. Decode sizes: one fused launch.
  cuda::RouterFusedArgs f = router_args(x, w, b, k, ids, weights, "router_topk");
  f.real_tokens = real_tokens;
  const int64_t t = f.num_tokens, e = f.num_experts;
  if (t <= gemv_max_rows_ && cuda::router_fused_supported(f)) {
    cuda::launch_bf16_router_fused(f, stream_);
    return;
  }
  blas_->matmul(x.data, w.data, nullptr, router_logits_, t, e, w.dim(1), /*out_f32=*/true, stream_);
  cuda::RouterTopkArgs a{static_cast<const float*>(router_logits_),
                         b.data,
                         b.dtype == DType::F32,
                         ids.ptr<int32_t>(),
                         weights.ptr<float>(),
                         int(t),
                         int(e),
                         k,
                         real_tokens};
  OSSRT_CUDA_CHECK(cuda::launch_f32_router_topk_softmax(a, stream_));
}

void CudaBackend::add_rmsnorm_router_topk(Tensor& residual, const Tensor& delta, const Tensor& norm_w, float eps,
                                          Tensor& normed, const Tensor& router_w, const Tensor& router_b, int k,
                                          Tensor& ids, Tensor& weights) {
  bind_device();
  constexpr const char* kOp = "add_rmsnorm_router_topk";
  // One-token steps on the fused router: the norm in its prologue (router.cu, RouterFusedArgs::fold_norm),
  // the same bits as the norm kernel then the router. (One row is graph bucket 1: never padding, so
  // no real_tokens.)
  if (router_norm_fold_ && !ablated(kAblateNorm) && !ablated(kAblateRouter) && residual.dim(0) == 1 &&
      gemv_max_rows_ >= 1) {
    cuda::RouterFusedArgs f = router_args(normed, router_w, router_b, k, ids, weights, kOp);
    f.fold_norm = true;
    f.norm = add_rmsnorm_args(residual, delta, nullptr, norm_w, eps, normed, kOp);
    // CTA 0 writes normed while every CTA reads residual and delta.
    OSSRT_CHECK(!bytes_overlap(normed, residual) && !bytes_overlap(normed, delta),
                "{}: normed overlaps residual or delta", kOp);
    if (cuda::router_fused_supported(f)) {
      cuda::launch_bf16_router_fused(f, stream_);
      ++folded_router_norm_launches_;
      return;
    }
  }
  add_rmsnorm(residual, delta, norm_w, eps, normed);
  route_rows(normed, router_w, router_b, k, ids, weights, step_real_tokens(normed.dim(0)));
}

void CudaBackend::moe(const Tensor& x, const ExpertWeights& ex, const Tensor& ids, const Tensor& weights,
                      const SwigluParams& swiglu, Tensor& out) {
  bind_device();
  if (ablated(kAblateMoe)) return;
  check_on_device(x, "moe", "x");
  check_on_device(ids, "moe", "ids");
  check_on_device(weights, "moe", "weights");
  check_float(out, "moe", "out");
  const int64_t t = x.dim(0);
  const int k = int(ids.row_elems());
  OSSRT_CHECK(x.dtype == DType::BF16 && x.row_elems() == ex.hidden && out.row_elems() == ex.hidden && out.dim(0) >= t,
              "moe: x {} / out {} for hidden {}", x.shape_str(), out.shape_str(), ex.hidden);
  OSSRT_CHECK(ids.dtype == DType::I32 && weights.dtype == DType::F32 && weights.row_elems() == k && ids.dim(0) >= t &&
                  weights.dim(0) >= t,
              "moe: ids {} / weights {} for {} tokens", ids.shape_str(), weights.shape_str(), t);
  // U8 experts are resident MXFP4 (upload_experts with WeightFormat::Mxfp4), FP8_E4M3 ones FP8 codes
  // (WeightFormat::Fp8), both in their kernels' layouts.
  const bool mxfp4 = ex.gate_up_w.dtype == DType::U8;
  const bool fp8 = ex.gate_up_w.dtype == DType::FP8_E4M3;
  const bool scaled =
      (mxfp4 || fp8) && ex.down_w.dtype == ex.gate_up_w.dtype && ex.gate_up_scales.data && ex.down_scales.data;
  OSSRT_CHECK((ex.gate_up_w.dtype == DType::BF16 || scaled) && ex.gate_up_b.dtype == DType::F32,
              "moe: expert weights were not uploaded by the CUDA backend");
  // The route kernel indexes experts by global id; expert parallelism (a partial expert set) is
  // proven on the CPU backend only so far (docs/parallel.md).
  OSSRT_CHECK(ex.first_expert == 0 && ex.total_experts() == ex.experts,
              "moe: this layer holds experts [{}, {}) of {}; the CUDA backend does not run a partial expert set yet "
              "(--expert-parallel-size > 1 needs --backend cpu)",
              ex.first_expert, ex.first_expert + ex.experts, ex.total_experts());
  const size_t need =
      fp8 ? cuda::moe_fp8_workspace_bytes(int(t), k, int(ex.experts), int(ex.hidden), int(ex.intermediate))
          : cuda::moe_workspace_bytes(int(t), k, int(ex.experts), int(ex.hidden), int(ex.intermediate));
  OSSRT_CHECK(need <= moe_workspace_bytes_, "moe: {} tokens x top-{} need {} workspace bytes, {} planned", t, k, need,
              moe_workspace_bytes_);
  cuda::MoeArgs a;
  a.num_tokens = int(t);
  a.top_k = k;
  a.num_experts = int(ex.experts);
  a.hidden = int(ex.hidden);
  a.intermediate = int(ex.intermediate);
  a.swiglu_alpha = swiglu.alpha;
  a.swiglu_limit = swiglu.limit;
  a.x = static_cast<const uint16_t*>(x.data);
  a.ids = ids.ptr<int32_t>();
  a.weights = weights.ptr<float>();
  if (mxfp4) {
    a.gate_up_q = static_cast<const uint8_t*>(ex.gate_up_w.data);
    a.gate_up_scales = static_cast<const uint8_t*>(ex.gate_up_scales.data);
    a.down_q = static_cast<const uint8_t*>(ex.down_w.data);
    a.down_scales = static_cast<const uint8_t*>(ex.down_scales.data);
  } else if (fp8) {
    a.gate_up_fp8 = static_cast<const uint8_t*>(ex.gate_up_w.data);
    a.gate_up_fp8_scales = ex.gate_up_scales.ptr<float>();
    a.down_fp8 = static_cast<const uint8_t*>(ex.down_w.data);
    a.down_fp8_scales = ex.down_scales.ptr<float>();
    a.fp8_large_m_wgmma = fp8_moe_wgmma_;
  } else {
    a.gate_up_w = static_cast<const uint16_t*>(ex.gate_up_w.data);
    a.down_w = static_cast<const uint16_t*>(ex.down_w.data);
  }
  a.gate_up_b = ex.gate_up_b.data;
  a.down_b = ex.down_b.data;
  a.bias_bf16 = false;
  a.out = out.data;
  a.out_bf16 = out.dtype == DType::BF16;
  a.workspace = moe_workspace_;
  a.workspace_bytes = moe_workspace_bytes_;
  if (moe_direct_max_pairs_ >= 0) a.direct_max_pairs = moe_direct_max_pairs_;
  if (moe_fold_combine_) {
    a.tickets = moe_tickets_;
    a.tickets_capacity = kMoeTickets;
  }
  if (mxfp4)
    cuda::launch_bf16_mxfp4w_moe(a, stream_);
  else if (fp8)
    cuda::launch_bf16_fp8w_moe(a, stream_);
  else
    cuda::launch_bf16_bf16w_moe(a, stream_);
  OSSRT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::gather_logit_rows(const Tensor& x, Tensor& out) {
  bind_device();
  check_float(x, "gather_logit_rows", "x");
  check_float(out, "gather_logit_rows", "out");
  const StepPlan& plan = plan_->host_plan();
  const int r = int(plan.logit_rows.size());
  OSSRT_CHECK(out.dtype == x.dtype && out.row_elems() == x.row_elems() && out.dim(0) >= r,
              "gather_logit_rows: x {} / out {} for {} rows", x.shape_str(), out.shape_str(), r);
  for (int32_t row : plan.logit_rows)
    OSSRT_CHECK(row < x.dim(0), "gather_logit_rows: row {} outside x {}", row, x.shape_str());
  cuda::GatherRowsArgs a{x.data, plan_->device_plan().logit_rows, out.data, r,
                         int64_t(x.row_elems() * int64_t(dtype_size(x.dtype)))};
  OSSRT_CUDA_CHECK(cuda::launch_gather_rows(a, stream_));
}

}  // namespace ossrt
