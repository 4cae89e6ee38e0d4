// The CPU reference backend: owns host memory, converts weights to fp32, keeps the paged KV cache,
// checks every op's shapes and the step plan (bad input is an ossrt::Error, never a wild read), and
// hands the math to cpu_kernels.h (the FP8 weight formats' quantization to cpu_fp8.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_fp8.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/kv_cache_scales.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/threads.h"

namespace ossrt {

namespace {

Tensor make_view(void* data, DType dtype, const std::vector<int64_t>& shape) {
  OSSRT_CHECK(shape.size() <= size_t(kMaxDims), "tensor rank {} > {}", shape.size(), kMaxDims);
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = Device::CPU;
  t.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

void expect_f32(const Tensor& t, const char* op, const char* what) {
  OSSRT_CHECK(!t.empty(), "{}: {} is empty", op, what);
  OSSRT_CHECK(t.device == Device::CPU, "{}: {} is not a CPU tensor", op, what);
  OSSRT_CHECK(t.dtype == DType::F32, "{}: {} has dtype {}, expected F32", op, what, dtype_name(t.dtype));
}

void expect_matrix(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* what) {
  OSSRT_CHECK(t.ndim == 2 && t.dim(0) == rows && t.dim(1) == cols, "{}: {} has shape {}, expected [{}, {}]", op, what,
              t.shape_str(), rows, cols);
}

void expect_vector(const Tensor& t, int64_t n, const char* op, const char* what) {
  OSSRT_CHECK(t.numel() == n, "{}: {} has shape {}, expected {} elements", op, what, t.shape_str(), n);
}

// calloc'ed bytes: large blocks come zeroed from mmap, so a KV pool planned from available
// memory takes pages only as tokens are cached (a zero-filled std::vector would touch them all).
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using LazyZero = std::unique_ptr<void, FreeDeleter>;

LazyZero lazy_zero(size_t bytes, const char* what) {
  void* p = std::calloc(std::max<size_t>(bytes, 1), 1);
  OSSRT_CHECK(p != nullptr, "out of memory allocating {} ({:.1f} MiB)", what, double(bytes) / 1048576.0);
  return LazyZero(p);
}

// Storage of one KV group: per layer, K and V of [num_blocks][num_kv_heads][block_size][head_dim],
// fp32, or e4m3 codes with per-layer, per-KV-head scales (the full group under --kv-cache-dtype fp8).
struct KvGroupStorage {
  std::vector<LazyZero> k, v;
  int num_blocks = 0;
  bool fp8 = false;
  std::vector<float> k_scales, v_scales;  // fp8: [layers][num_kv_heads]
};

// Available system memory (/proc/meminfo MemAvailable), 0 when it cannot be read.
size_t available_system_memory() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  size_t kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %zu kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024;
}

// "Intel(R) Xeon(R) ..." from /proc/cpuinfo; "" where there is none.
std::string cpu_model_name() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) return {};
  char line[512];
  std::string name;
  while (name.empty() && std::fgets(line, sizeof line, f)) {
    std::string_view l(line);
    if (!l.starts_with("model name")) continue;
    const size_t colon = l.find(':');
    if (colon == std::string_view::npos) continue;
    l.remove_prefix(colon + 1);
    while (!l.empty() && (l.front() == ' ' || l.front() == '\t')) l.remove_prefix(1);
    while (!l.empty() && (l.back() == '\n' || l.back() == ' ')) l.remove_suffix(1);
    name = std::string(l);
  }
  std::fclose(f);
  return name;
}

class CpuBackend final : public Backend {
 public:
  // Every format is implemented: Reference and Mxfp4 are the same f32 weights here (the experts are
  // the MXFP4 values exactly), Fp8 and Mxfp4Fp8 quantize as cpu_fp8.h says.
  explicit CpuBackend(const BackendOptions& options)
      : pool_(options.threads),
        weight_format_(options.weight_format),
        kv_fp8_(options.kv_cache_dtype == KvCacheDtype::Fp8E4m3),
        kv_k_scales_(options.kv_k_scales),
        kv_v_scales_(options.kv_v_scales),
        bf16_moe_activations_(options.bf16_moe_activations) {}

  std::string name() const override { return "cpu"; }
  std::string device_description() const override {
    const std::string model = cpu_model_name();
    return fmt::format("cpu{}{}, {} threads", model.empty() ? "" : ": ", model, pool_.size());
  }
  Device device() const override { return Device::CPU; }
  DType activation_dtype() const override { return DType::F32; }
  DType residual_dtype() const override { return DType::F32; }

  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) override {
    return alloc_shape(dtype, std::vector<int64_t>(shape));
  }

  std::vector<float> to_host_f32(const Tensor& t) override {
    std::vector<float> out(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      switch (t.dtype) {
        case DType::F32: out[size_t(i)] = t.ptr<float>()[i]; break;
        case DType::BF16: out[size_t(i)] = bf16_to_f32(t.ptr<uint16_t>()[i]); break;
        case DType::F16: out[size_t(i)] = f16_to_f32(t.ptr<uint16_t>()[i]); break;
        case DType::I32: out[size_t(i)] = float(t.ptr<int32_t>()[i]); break;
        default: fail("to_host_f32: unsupported dtype {}", dtype_name(t.dtype));
      }
    }
    return out;
  }
  void to_host(const Tensor& t, void* dst) override { std::memcpy(dst, t.data, t.bytes()); }
  void from_host(Tensor& t, const void* src) override { std::memcpy(t.data, src, t.bytes()); }
  void sync() override {}
  // Same dtype: one memcpy (the default stages through a host vector, which every layer's out-of-place
  // residual add would pay; Backend::add_rmsnorm_qkv_rope_cache_write).
  void copy(const Tensor& src, Tensor& dst) override {
    if (src.dtype != dst.dtype) return Backend::copy(src, dst);
    OSSRT_CHECK(src.numel() == dst.numel(), "copy: src {} and dst {} differ", src.shape_str(), dst.shape_str());
    std::memmove(dst.data, src.data, src.bytes());
  }

  Tensor upload(const HostTensor& src) override {
    OSSRT_CHECK(!src.empty(), "upload: tensor '{}' has no data", src.name);
    Tensor t = alloc_shape(DType::F32, src.shape, &weight_bytes_);
    src.to_f32(0, src.numel(), t.ptr<float>());
    return t;
  }

  Tensor upload_concat_rows(std::span<const HostTensor* const> parts) override {
    OSSRT_CHECK(!parts.empty(), "upload_concat_rows: no parts");
    std::vector<int64_t> shape = parts[0]->shape;
    OSSRT_CHECK(!shape.empty(), "upload_concat_rows: '{}' is a scalar", parts[0]->name);
    int64_t rows = 0;
    for (const HostTensor* p : parts) {
      OSSRT_CHECK(!p->empty(), "upload_concat_rows: tensor '{}' has no data", p->name);
      OSSRT_CHECK(p->shape.size() == shape.size() && std::equal(shape.begin() + 1, shape.end(), p->shape.begin() + 1),
                  "upload_concat_rows: '{}' does not match the trailing dimensions of '{}'", p->name, parts[0]->name);
      rows += p->shape[0];
    }
    shape[0] = rows;
    Tensor t = alloc_shape(DType::F32, shape, &weight_bytes_);
    float* dst = t.ptr<float>();
    for (const HostTensor* p : parts) {
      p->to_f32(0, p->numel(), dst);
      dst += p->numel();
    }
    return t;
  }

  Tensor upload_linear(std::span<const HostTensor* const> parts) override {
    if (!cpu::quantizes_dense_weights(weight_format_)) return Backend::upload_linear(parts);
    OSSRT_CHECK(!parts.empty(), "upload_linear: no parts");
    int64_t rows = 0;
    for (const HostTensor* p : parts) {
      OSSRT_CHECK(!p->empty(), "upload_linear: tensor '{}' has no data", p->name);
      OSSRT_CHECK(p->shape.size() == 2 && p->shape[1] == parts[0]->shape[1],
                  "upload_linear: '{}' is not a matrix with the columns of '{}'", p->name, parts[0]->name);
      rows += p->shape[0];
    }
    Tensor t = alloc_shape(DType::F32, {rows, parts[0]->shape[1]}, &weight_bytes_);
    cpu::upload_fp8_parts(pool_, parts, t.ptr<float>());
    fp8_weights_.insert(t.data);
    return t;
  }

  ExpertWeights upload_experts(const HostExperts& gate_up, const HostExperts& down) override {
    OSSRT_CHECK(gate_up.experts == down.experts && gate_up.out == 2 * down.in && gate_up.in == down.out,
                "upload_experts: gate_up [{}, {}, {}] and down [{}, {}, {}] do not fit together", gate_up.experts,
                gate_up.out, gate_up.in, down.experts, down.out, down.in);
    ExpertWeights w;
    w.experts = gate_up.experts;
    w.hidden = gate_up.in;
    w.intermediate = down.in;
    w.gate_up_w = upload_expert_matrix(gate_up);
    w.gate_up_b = upload_expert_bias(gate_up);
    w.down_w = upload_expert_matrix(down);
    w.down_b = upload_expert_bias(down);
    if (cpu::quantizes_expert_weights(weight_format_)) {
      w.gate_up_scales = quantize_expert_matrix(w.gate_up_w);
      w.down_scales = quantize_expert_matrix(w.down_w);
    }
    return w;
  }

  void allocate_kv_cache(const KvCacheShape& shape) override {
    OSSRT_CHECK(shape.block_size > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0 && shape.num_full_blocks >= 0 &&
                    shape.num_window_blocks >= 0 && shape.num_full_layers >= 0 && shape.num_sliding_layers >= 0,
                "allocate_kv_cache: invalid shape");
    kv_shape_ = shape;
    auto make_group = [&](int layers, int blocks, bool fp8) {
      KvGroupStorage g;
      g.num_blocks = blocks;
      g.fp8 = fp8;
      const size_t bytes = size_t(blocks) * size_t(shape.num_kv_heads) * size_t(shape.block_size) *
                           size_t(shape.head_dim) * (fp8 ? sizeof(uint8_t) : sizeof(float));
      for (int l = 0; l < layers; ++l) {
        g.k.push_back(lazy_zero(bytes, "the KV cache"));
        g.v.push_back(lazy_zero(bytes, "the KV cache"));
      }
      if (fp8) {
        g.k_scales = kv_cache_scales_or_ones(kv_k_scales_, layers, shape.num_kv_heads, "K");
        g.v_scales = kv_cache_scales_or_ones(kv_v_scales_, layers, shape.num_kv_heads, "V");
      }
      kv_bytes_ += 2 * size_t(layers) * bytes;
      return g;
    };
    kv_bytes_ = 0;
    groups_[0] = make_group(shape.num_full_layers, shape.num_full_blocks, kv_fp8_);
    groups_[1] = make_group(shape.num_sliding_layers, shape.num_window_blocks, false);
    spdlog::debug("cpu: KV cache {} full blocks x {} layers, {} window blocks x {} layers", shape.num_full_blocks,
                  shape.num_full_layers, shape.num_window_blocks, shape.num_sliding_layers);
  }

  size_t kv_block_bytes(const KvCacheShape& shape) const override {
    return 2 * size_t(shape.num_kv_heads) * size_t(shape.block_size) * size_t(shape.head_dim) * sizeof(float);
  }
  size_t kv_full_block_bytes(const KvCacheShape& shape) const override {
    if (!kv_fp8_) return kv_block_bytes(shape);
    return 2 * size_t(shape.num_kv_heads) * size_t(shape.block_size) * size_t(shape.head_dim) * sizeof(uint8_t);
  }

  MemoryUse memory_use() const override {
    MemoryUse m;
    m.weights = weight_bytes_;
    m.workspaces = workspace_bytes_;
    m.kv_cache = kv_bytes_;
    m.capacity = available_system_memory();
    return m;
  }

  void begin_step(const StepPlan& plan) override {
    check_plan_consistency(plan);
    plan_ = plan;  // a copy: the caller's plan may die before the step's ops run
  }

  void embedding(const Tensor& table, Tensor& out) override {
    expect_f32(table, "embedding", "table");
    expect_f32(out, "embedding", "out");
    const int64_t T = plan_.num_tokens(), H = table.dim(1);
    expect_matrix(out, T, H, "embedding", "out");
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = plan_.token_ids[size_t(t)];
      OSSRT_CHECK(id >= 0 && id < table.dim(0), "embedding: token id {} at row {} outside the vocabulary of {}", id, t,
                  table.dim(0));
      std::copy_n(table.ptr<float>() + id * H, H, out.ptr<float>() + t * H);
    }
  }

  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    expect_f32(x, "rmsnorm", "x"), expect_f32(w, "rmsnorm", "w"), expect_f32(out, "rmsnorm", "out");
    // dim(1), not row_elems(): a step may have zero logit rows, and row_elems() divides by the row count.
    OSSRT_CHECK(x.ndim == 2, "rmsnorm: x has shape {}, expected [rows, features]", x.shape_str());
    const int64_t T = x.dim(0), H = x.dim(1);
    expect_vector(w, H, "rmsnorm", "w");
    expect_matrix(out, T, H, "rmsnorm", "out");
    pool_.parallel_for(T, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        cpu::rmsnorm_row(x.ptr<float>() + t * H, w.ptr<float>(), H, eps, out.ptr<float>() + t * H);
    });
  }

  void add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& w, float eps, Tensor& out) override {
    add(residual, delta);
    rmsnorm(residual, w, eps, out);
  }

  void add(Tensor& residual, const Tensor& delta) override {
    expect_f32(residual, "add", "residual"), expect_f32(delta, "add", "delta");
    OSSRT_CHECK(residual.numel() == delta.numel(), "add: residual {} and delta {} differ", residual.shape_str(),
                delta.shape_str());
    float* r = residual.ptr<float>();
    const float* d = delta.ptr<float>();
    for (int64_t i = 0; i < residual.numel(); ++i) r[i] += d[i];
  }

  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    expect_f32(x, "linear", "x"), expect_f32(w, "linear", "w"), expect_f32(out, "linear", "out");
    OSSRT_CHECK(w.ndim == 2, "linear: weight has shape {}, expected [out, in]", w.shape_str());
    const int64_t T = x.dim(0), in = w.dim(1), n_out = w.dim(0);
    expect_matrix(x, T, in, "linear", "x");
    expect_matrix(out, T, n_out, "linear", "out");
    if (bias) expect_f32(*bias, "linear", "bias"), expect_vector(*bias, n_out, "linear", "bias");
    const float* input = x.ptr<float>();
    std::vector<float> quantized_input;
    if (fp8_weights_.contains(w.data)) {  // an upload_linear weight of an FP8 format
      quantized_input.resize(size_t(T * in));
      cpu::fp8_quantize_activations(pool_, input, T, in, quantized_input.data());
      input = quantized_input.data();
    }
    cpu::linear(pool_, input, T, in, w.ptr<float>(), n_out, bias ? bias->ptr<float>() : nullptr, out.ptr<float>());
  }

  void rope_and_cache_write(Tensor& qkv, const RopeParams& rope, const AttentionParams& params) override {
    const cpu::KvLayerView kv = check_attention_args(qkv, params, "rope_and_cache_write");
    OSSRT_CHECK(int(rope.inv_freq.size()) * 2 == params.head_dim, "rope_and_cache_write: {} inv_freq for head_dim {}",
                rope.inv_freq.size(), params.head_dim);
    cpu::check_write_slots(plan_, params, kv);
    cpu::rope_and_cache_write(pool_, plan_, qkv.ptr<float>(), rope, params, kv);
  }

  void attention(const Tensor& qkv, const Tensor& sinks, const AttentionParams& params, Tensor& out) override {
    const cpu::KvLayerView kv = check_attention_args(qkv, params, "attention");
    expect_f32(sinks, "attention", "sinks"), expect_vector(sinks, params.num_q_heads, "attention", "sinks");
    expect_f32(out, "attention", "out");
    expect_matrix(out, plan_.num_tokens(), int64_t(params.num_q_heads) * params.head_dim, "attention", "out");
    cpu::check_block_tables(plan_, params, kv);
    cpu::attention(pool_, plan_, qkv.ptr<float>(), sinks.ptr<float>(), params, kv, out.ptr<float>());
  }

  void router_topk(const Tensor& x, const Tensor& w, const Tensor& b, int k, Tensor& ids, Tensor& weights) override {
    expect_f32(x, "router_topk", "x"), expect_f32(w, "router_topk", "w"), expect_f32(b, "router_topk", "b");
    const int64_t T = x.dim(0), E = w.dim(0), H = w.dim(1);
    expect_matrix(x, T, H, "router_topk", "x");
    expect_vector(b, E, "router_topk", "b");
    OSSRT_CHECK(k >= 1 && k <= E, "router_topk: k = {} with {} experts", k, E);
    OSSRT_CHECK(ids.dtype == DType::I32, "router_topk: ids must be I32");
    expect_f32(weights, "router_topk", "weights");
    expect_matrix(ids, T, k, "router_topk", "ids");
    expect_matrix(weights, T, k, "router_topk", "weights");
    std::vector<float> logits(size_t(T * E));
    cpu::linear(pool_, x.ptr<float>(), T, H, w.ptr<float>(), E, b.ptr<float>(), logits.data());
    for (int64_t t = 0; t < T; ++t)
      cpu::topk_softmax(logits.data() + t * E, E, k, ids.ptr<int32_t>() + t * k, weights.ptr<float>() + t * k);
  }

  void moe(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
           const SwigluParams& swiglu, Tensor& out) override {
    expect_f32(x, "moe", "x"), expect_f32(weights, "moe", "weights"), expect_f32(out, "moe", "out");
    const int64_t T = x.dim(0), H = experts.hidden, I = experts.intermediate, E = experts.experts;
    expect_matrix(x, T, H, "moe", "x");
    expect_matrix(out, T, H, "moe", "out");
    OSSRT_CHECK(ids.dtype == DType::I32 && ids.ndim == 2 && ids.dim(0) == T, "moe: ids must be I32 [{}, k], got {}", T,
                ids.shape_str());
    const int k = int(ids.dim(1));
    expect_matrix(weights, T, k, "moe", "weights");
    expect_f32(experts.gate_up_w, "moe", "gate_up_w"), expect_f32(experts.down_w, "moe", "down_w");
    expect_vector(experts.gate_up_w, E * 2 * I * H, "moe", "gate_up_w");
    expect_vector(experts.gate_up_b, E * 2 * I, "moe", "gate_up_b");
    expect_vector(experts.down_w, E * H * I, "moe", "down_w");
    expect_vector(experts.down_b, E * H, "moe", "down_b");
    const int64_t total = experts.total_experts();
    OSSRT_CHECK(experts.first_expert >= 0 && experts.first_expert + E <= total,
                "moe: local experts [{}, {}) outside the {} experts of the model", experts.first_expert,
                experts.first_expert + E, total);
    for (int64_t i = 0; i < T * k; ++i)
      OSSRT_CHECK(ids.ptr<int32_t>()[i] >= 0 && ids.ptr<int32_t>()[i] < total,
                  "moe: expert id {} at [{}, {}] outside [0, {})", ids.ptr<int32_t>()[i], i / k, i % k, total);
    const cpu::ExpertsView view{experts.gate_up_w.ptr<float>(),
                                experts.gate_up_b.ptr<float>(),
                                experts.down_w.ptr<float>(),
                                experts.down_b.ptr<float>(),
                                E,
                                H,
                                I,
                                experts.first_expert,
                                /*fp8_activations=*/!experts.gate_up_scales.empty(),
                                /*bf16_activations=*/bf16_moe_activations_};
    cpu::moe(pool_, x.ptr<float>(), T, view, ids.ptr<int32_t>(), weights.ptr<float>(), k, swiglu, out.ptr<float>());
  }

  bool supports_moe_dispatch() const override { return true; }

  void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override {
    expect_f32(x, "gather_rows", "x"), expect_f32(out, "gather_rows", "out");
    OSSRT_CHECK(x.ndim == 2, "gather_rows: x has shape {}, expected [rows, features]", x.shape_str());
    const int64_t H = x.dim(1);
    expect_matrix(out, int64_t(rows.size()), H, "gather_rows", "out");
    for (size_t i = 0; i < rows.size(); ++i) {
      const int32_t row = rows[i];
      OSSRT_CHECK(row < x.dim(0), "gather_rows: row {} outside [0, {})", row, x.dim(0));
      float* dst = out.ptr<float>() + int64_t(i) * H;
      if (row < 0)
        std::fill_n(dst, H, 0.0f);
      else
        std::copy_n(x.ptr<float>() + int64_t(row) * H, H, dst);
    }
  }

  void sum_rows(const Tensor& src, std::span<const int32_t> index, int per_row, Tensor& out) override {
    expect_f32(src, "sum_rows", "src"), expect_f32(out, "sum_rows", "out");
    OSSRT_CHECK(src.ndim == 2 && out.ndim == 2 && src.dim(1) == out.dim(1),
                "sum_rows: src {} and out {} must be matrices of the same width", src.shape_str(), out.shape_str());
    OSSRT_CHECK(per_row >= 0 && int64_t(index.size()) == out.dim(0) * per_row, "sum_rows: {} indices for {} rows of {}",
                index.size(), out.dim(0), per_row);
    for (int32_t i : index) OSSRT_CHECK(i < src.dim(0), "sum_rows: row {} outside [0, {})", i, src.dim(0));
    const int64_t H = src.dim(1);
    for (int64_t r = 0; r < out.dim(0); ++r) {
      float* o = out.ptr<float>() + r * H;
      std::fill_n(o, H, 0.0f);
      for (int j = 0; j < per_row; ++j) {
        const int32_t i = index[size_t(r * per_row + j)];
        if (i < 0) continue;
        const float* s = src.ptr<float>() + int64_t(i) * H;
        for (int64_t h = 0; h < H; ++h) o[h] += s[h];
      }
    }
  }

  void gather_logit_rows(const Tensor& x, Tensor& out) override {
    expect_f32(x, "gather_logit_rows", "x"), expect_f32(out, "gather_logit_rows", "out");
    OSSRT_CHECK(x.ndim == 2, "gather_logit_rows: x has shape {}, expected [rows, features]", x.shape_str());
    const int64_t R = int64_t(plan_.logit_rows.size()), H = x.dim(1);
    expect_matrix(out, R, H, "gather_logit_rows", "out");
    for (int64_t r = 0; r < R; ++r) {
      const int32_t row = plan_.logit_rows[size_t(r)];
      OSSRT_CHECK(row >= 0 && row < x.dim(0), "gather_logit_rows: row {} outside [0, {})", row, x.dim(0));
      std::copy_n(x.ptr<float>() + row * H, H, out.ptr<float>() + r * H);
    }
  }

 private:
  // `counter`: which of the memory report's figures the buffer adds to (workspaces by default).
  Tensor alloc_shape(DType dtype, const std::vector<int64_t>& shape, size_t* counter = nullptr) {
    int64_t n = 1;
    for (int64_t d : shape) {
      OSSRT_CHECK(d >= 0, "alloc: negative dimension {}", d);
      n *= d;
    }
    // Zero-filled, so a workspace read before it is written is deterministic.
    const size_t bytes = std::max<size_t>(1, size_t(n) * dtype_size(dtype));
    auto buffer = std::make_unique<std::byte[]>(bytes);
    *(counter ? counter : &workspace_bytes_) += bytes;
    Tensor t = make_view(buffer.get(), dtype, shape);
    buffers_.push_back(std::move(buffer));
    return t;
  }

  Tensor upload_expert_matrix(const HostExperts& src) {
    Tensor t = alloc_shape(DType::F32, {src.experts, src.out, src.in}, &weight_bytes_);
    float* dst = t.ptr<float>();
    pool_.parallel_for(src.experts * src.out, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) src.row_f32(row / src.out, row % src.out, dst + row * src.in);
    });
    return t;
  }

  // Quantizes uploaded expert matrices [E, out, in] in place; returns their block scales.
  Tensor quantize_expert_matrix(Tensor& w) {
    const int64_t E = w.dim(0), out = w.dim(1), in = w.dim(2);
    auto blocks = [](int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; };
    Tensor scales = alloc_shape(DType::F32, {E, blocks(out), blocks(in)}, &weight_bytes_);
    cpu::fp8_quantize_experts_inplace(pool_, w.ptr<float>(), E, out, in, scales.ptr<float>());
    return scales;
  }

  Tensor upload_expert_bias(const HostExperts& src) {
    OSSRT_CHECK(src.bias.numel() == src.experts * src.out, "upload_experts: bias '{}' has {} elements, expected {}",
                src.bias.name, src.bias.numel(), src.experts * src.out);
    Tensor t = alloc_shape(DType::F32, {src.experts, src.out}, &weight_bytes_);
    src.bias.to_f32(0, src.bias.numel(), t.ptr<float>());
    return t;
  }

  // Plan invariants every op relies on; the slot and block-table checks that need a layer's KV
  // geometry are in cpu::check_write_slots / check_block_tables.
  static void check_plan_consistency(const StepPlan& plan) {
    const size_t T = plan.token_ids.size();
    OSSRT_CHECK(plan.block_size > 0, "plan: block_size {} must be positive", plan.block_size);
    OSSRT_CHECK(plan.positions.size() == T && plan.token_seq.size() == T,
                "plan: {} token ids but {} positions and {} sequence indices", T, plan.positions.size(),
                plan.token_seq.size());
    for (size_t t = 0; t < T; ++t) {
      const int32_t si = plan.token_seq[t];
      OSSRT_CHECK(si >= 0 && si < plan.num_seqs(), "plan: token {} belongs to sequence {} of {}", t, si,
                  plan.num_seqs());
      const SeqStep& s = plan.seqs[size_t(si)];
      OSSRT_CHECK(int(t) >= s.token_begin && int(t) < s.token_begin + s.num_tokens,
                  "plan: token {} is outside its sequence's rows [{}, {})", t, s.token_begin,
                  s.token_begin + s.num_tokens);
      OSSRT_CHECK(plan.positions[t] == s.context_begin + (int(t) - s.token_begin),
                  "plan: token {} has position {} but its sequence puts it at {}", t, plan.positions[t],
                  s.context_begin + (int(t) - s.token_begin));
    }
    for (int si = 0; si < plan.num_seqs(); ++si) {
      const SeqStep& s = plan.seqs[size_t(si)];
      OSSRT_CHECK(
          s.token_begin >= 0 && s.num_tokens >= 0 && size_t(s.token_begin + s.num_tokens) <= T && s.context_begin >= 0,
          "plan: sequence {} rows [{}, +{}) at context {} do not fit {} tokens", si, s.token_begin, s.num_tokens,
          s.context_begin, T);
      for (int t = s.token_begin; t < s.token_begin + s.num_tokens; ++t)
        OSSRT_CHECK(plan.token_seq[size_t(t)] == si, "plan: row {} is in sequence {}'s range but marked {}", t, si,
                    plan.token_seq[size_t(t)]);
    }
  }

  cpu::KvLayerView check_attention_args(const Tensor& qkv, const AttentionParams& p, const char* op) {
    expect_f32(qkv, op, "qkv");
    OSSRT_CHECK(p.num_q_heads > 0 && p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0 && p.head_dim > 0 &&
                    p.head_dim % 2 == 0 && p.window >= 0,
                "{}: invalid attention params (Hq {}, Hkv {}, D {}, window {})", op, p.num_q_heads, p.num_kv_heads,
                p.head_dim, p.window);
    expect_matrix(qkv, plan_.num_tokens(), int64_t(p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim, op, "qkv");
    OSSRT_CHECK(p.num_kv_heads == kv_shape_.num_kv_heads && p.head_dim == kv_shape_.head_dim,
                "{}: {} KV heads of dim {}, but the cache holds {} of dim {}", op, p.num_kv_heads, p.head_dim,
                kv_shape_.num_kv_heads, kv_shape_.head_dim);
    KvGroupStorage& g = groups_[p.group == KvGroup::Full ? 0 : 1];
    OSSRT_CHECK(p.layer_in_group >= 0 && size_t(p.layer_in_group) < g.k.size(),
                "{}: layer {} of the {} group, but the cache has {} such layers", op, p.layer_in_group,
                p.group == KvGroup::Full ? "full" : "sliding", g.k.size());
    const size_t layer = size_t(p.layer_in_group);
    cpu::KvLayerView kv;
    if (g.fp8) {
      kv.k8 = static_cast<uint8_t*>(g.k[layer].get());
      kv.v8 = static_cast<uint8_t*>(g.v[layer].get());
      kv.k_scale = g.k_scales.data() + layer * size_t(kv_shape_.num_kv_heads);
      kv.v_scale = g.v_scales.data() + layer * size_t(kv_shape_.num_kv_heads);
    } else {
      kv.k = static_cast<float*>(g.k[layer].get());
      kv.v = static_cast<float*>(g.v[layer].get());
    }
    kv.num_blocks = g.num_blocks;
    kv.num_kv_heads = kv_shape_.num_kv_heads;
    kv.block_size = kv_shape_.block_size;
    kv.head_dim = kv_shape_.head_dim;
    OSSRT_CHECK(kv.num_blocks > 0, "{}: no KV storage for {} layer {}: call allocate_kv_cache first", op,
                p.group == KvGroup::Full ? "full" : "sliding", p.layer_in_group);
    OSSRT_CHECK(plan_.block_size == kv.block_size, "{}: plan block_size {} differs from the KV cache's {}", op,
                plan_.block_size, kv.block_size);
    return kv;
  }

  ThreadPool pool_;
  const WeightFormat weight_format_;
  const bool kv_fp8_;  // the full layers' K and V as e4m3 (--kv-cache-dtype fp8)
  const std::vector<float> kv_k_scales_, kv_v_scales_;
  const bool bf16_moe_activations_;  // BackendOptions::bf16_moe_activations (accuracy floors)
  // The weights upload_linear quantized: linear() quantizes its input for these only.
  std::unordered_set<const void*> fp8_weights_;
  std::vector<std::unique_ptr<std::byte[]>> buffers_;
  size_t weight_bytes_ = 0, workspace_bytes_ = 0, kv_bytes_ = 0;
  KvCacheShape kv_shape_;
  KvGroupStorage groups_[2];  // [0] full layers, [1] sliding layers
  StepPlan plan_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace ossrt
