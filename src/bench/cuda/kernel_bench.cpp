#include "bench/cuda/kernel_bench.h"

#include <cuda_runtime_api.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <set>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/sample.cuh"
#include "bench/cuda/timing.cuh"
#include "bench/kernel_floors.h"
#include "bench/stats.h"
#include "config/gpt_oss_config.h"
#include "core/build_info.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/host_weights.h"
#include "model/rope.h"
#include "model/single_sequence.h"
#include "runtime/quantization.h"

namespace ossrt::bench {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBlock = 16;
// Launch gap covered by the spin kernel: at least this, and three times the op's host enqueue time.
constexpr double kMinSpinSeconds = 50e-6;
// The reference rates are measured on buffers far larger than L2.
constexpr size_t kCopyBytes = size_t(1) << 30;
constexpr int kGemmSize = 8192;

// Fast, seeded, portable host data: splitmix64 bits mapped to a uniform [-scale, scale) bf16.
struct HostRandom {
  uint64_t state;
  explicit HostRandom(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform(float scale) { return (float(next() >> 40) * 0x1.0p-24f * 2.0f - 1.0f) * scale; }
  std::vector<uint16_t> bf16(size_t n, float scale) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = f32_to_bf16(uniform(scale));
    return v;
  }
  std::vector<float> f32(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(scale);
    return v;
  }
  std::vector<uint8_t> bytes(size_t n) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t r = next();
      for (size_t j = 0; j < 8 && i + j < n; ++j) v[i + j] = uint8_t(r >> (8 * j));
    }
    return v;
  }
};

HostTensor host_view(const void* data, DType dtype, std::vector<int64_t> shape, std::string name) {
  HostTensor t;
  t.data = data;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.name = std::move(name);
  return t;
}

std::string utc_now() {
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}Z",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(std::chrono::system_clock::now())));
}

// Times one op: for every launch, flush L2, spin, event, op, event; the op's host work runs while
// the spin kernel holds the GPU, so the events bracket the op's kernels alone.
class OpTimer {
 public:
  OpTimer(CudaBackend& backend, size_t l2_bytes) : backend_(backend), stream_(backend.stream()) {
    flush_bytes_ = std::max<size_t>(2 * l2_bytes, 16u << 20) / 16 * 16;
    flush_ = backend.alloc(DType::U8, {int64_t(flush_bytes_)});
    sink_ = backend.alloc(DType::I32, {4});
    OSSRT_CUDA_CHECK(cudaMemsetAsync(flush_.data, 0x5a, flush_bytes_, stream_));
    OSSRT_CUDA_CHECK(cudaEventCreate(&start_));
    OSSRT_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~OpTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  std::vector<double> time(int warmup, int iterations, const std::function<void()>& op) {
    std::vector<double> samples;
    double spin = kMinSpinSeconds;
    for (int i = 0; i < warmup + iterations; ++i) {
      OSSRT_CUDA_CHECK(
          ossrt::bench::cuda::launch_l2_flush(flush_.data, flush_bytes_, static_cast<unsigned*>(sink_.data), stream_));
      OSSRT_CUDA_CHECK(ossrt::bench::cuda::launch_spin((unsigned long long)(spin * 1e9), stream_));
      OSSRT_CUDA_CHECK(cudaEventRecord(start_, stream_));
      const Clock::time_point host0 = Clock::now();
      op();
      const double enqueue = std::chrono::duration<double>(Clock::now() - host0).count();
      OSSRT_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      OSSRT_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      OSSRT_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      spin = std::max(spin, 3 * enqueue);
      if (i >= warmup) samples.push_back(double(ms) * 1e-3);
    }
    return samples;
  }
  double median(int warmup, int iterations, const std::function<void()>& op) {
    const auto s = time(warmup, iterations, op);
    return percentile(s, 50);
  }

 private:
  CudaBackend& backend_;
  cudaStream_t stream_;
  Tensor flush_, sink_;
  size_t flush_bytes_ = 0;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

MachineRates measure_machine(int device) {
  MachineRates m;
  cudaDeviceProp prop{};
  OSSRT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  m.gpu = fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB)", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                      double(prop.totalGlobalMem) / double(1ull << 30));
  m.l2_bytes = size_t(prop.l2CacheSize);
  m.sms = prop.multiProcessorCount;
  BackendOptions bo;
  bo.device_index = device;
  bo.max_step_tokens = kGemmSize;
  CudaBackend backend(bo);
  OpTimer timer(backend, m.l2_bytes);
  // Copy bandwidth: read + write bytes of a 1 GiB device-to-device copy (docs/reference/PERFORMANCE.md's definition).
  Tensor a = backend.alloc(DType::U8, {int64_t(kCopyBytes)}), b = backend.alloc(DType::U8, {int64_t(kCopyBytes)});
  OSSRT_CUDA_CHECK(cudaMemsetAsync(a.data, 0x3c, kCopyBytes, backend.stream()));
  const double copy_s = timer.median(2, 10, [&] {
    OSSRT_CUDA_CHECK(cudaMemcpyAsync(b.data, a.data, kCopyBytes, cudaMemcpyDeviceToDevice, backend.stream()));
  });
  m.copy_bytes_per_s = 2.0 * double(kCopyBytes) / copy_s;
  // Tensor-core rate: bf16 GEMM 8192^3 through the backend's linear op (cuBLASLt).
  HostRandom rng(7);
  const auto host = rng.bf16(size_t(kGemmSize) * kGemmSize, 1.0f);
  Tensor w = backend.upload(host_view(host.data(), DType::BF16, {kGemmSize, kGemmSize}, "gemm w"));
  Tensor x = backend.alloc(DType::BF16, {kGemmSize, kGemmSize});
  backend.from_host(x, host.data());
  Tensor y = backend.alloc(DType::BF16, {kGemmSize, kGemmSize});
  const double gemm_s = timer.median(2, 10, [&] { backend.linear(x, w, nullptr, y); });
  m.bf16_flops_per_s = 2.0 * kGemmSize * double(kGemmSize) * kGemmSize / gemm_s;
  backend.sync();
  return m;
}

// Everything one model's cases share on one backend: weights, activations, a filled KV cache.
class ModelBench {
 public:
  ModelBench(const KernelBenchOptions& o, const std::string& model, const MachineRates& machine, KernelBenchResult& out)
      : o_(o), c_(preset_config(model)), machine_(machine), out_(out) {
    max_decode_ = o.decode_tokens.empty() ? 0 : *std::max_element(o.decode_tokens.begin(), o.decode_tokens.end());
    max_prefill_ = o.prefill_tokens.empty() ? 0 : *std::max_element(o.prefill_tokens.begin(), o.prefill_tokens.end());
    max_tokens_ = std::max({max_decode_, max_prefill_, 1});
    BackendOptions bo;
    bo.device_index = o.device;
    bo.max_step_tokens = std::max(max_tokens_, 8192);
    bo.max_seqs = std::max(256, max_decode_);
    bo.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
    kv_fp8_ = bo.kv_cache_dtype == KvCacheDtype::Fp8E4m3;
    backend_ = std::make_unique<CudaBackend>(bo);
    timer_ = std::make_unique<OpTimer>(*backend_, machine.l2_bytes);
    rope_ = compute_rope_params(c_);
    upload_weights();
    allocate_activations();
    allocate_and_fill_kv();
  }

  void run_all() {
    for (int t : o_.decode_tokens) run_case("decode", t, t, o_.decode_context);
    for (int t : o_.prefill_tokens) run_case("prefill", t, 1, 0);
  }

 private:
  int64_t H() const { return c_.hidden_size; }
  int64_t Hq() const { return c_.num_attention_heads; }
  int64_t Hkv() const { return c_.num_key_value_heads; }
  int64_t D() const { return c_.head_dim; }
  int64_t E() const { return c_.num_experts; }
  int64_t K() const { return c_.experts_per_token; }
  int64_t I() const { return c_.intermediate_size; }
  int64_t V() const { return c_.vocab_size; }
  int64_t qkv_width() const { return (Hq() + 2 * Hkv()) * D(); }

  Tensor upload_bf16(std::vector<int64_t> shape, float scale, const char* name) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    const auto host = rng_.bf16(size_t(n), scale);
    return backend_->upload(host_view(host.data(), DType::BF16, std::move(shape), name));
  }
  Tensor random_activation(DType dtype, std::initializer_list<int64_t> shape, float scale) {
    Tensor t = backend_->alloc(dtype, shape);
    if (dtype == DType::F32) {
      const auto host = rng_.f32(size_t(t.numel()), scale);
      backend_->from_host(t, host.data());
    } else {
      const auto host = rng_.bf16(size_t(t.numel()), scale);
      backend_->from_host(t, host.data());
    }
    return t;
  }

  void upload_weights() {
    const float w_scale = 1.0f / std::sqrt(float(H()));
    {
      const auto table = rng_.bf16(size_t(V() * H()), 1.0f);
      embed_ = backend_->upload(host_view(table.data(), DType::BF16, {V(), H()}, "embed"));
      lm_head_ = backend_->upload(host_view(table.data(), DType::BF16, {V(), H()}, "lm_head"));
    }
    norm_w_ = upload_bf16({H()}, 1.0f, "norm");
    qkv_w_ = upload_bf16({qkv_width(), H()}, w_scale, "qkv_w");
    qkv_b_ = upload_bf16({qkv_width()}, 0.1f, "qkv_b");
    o_w_ = upload_bf16({H(), Hq() * D()}, 1.0f / std::sqrt(float(Hq() * D())), "o_w");
    o_b_ = upload_bf16({H()}, 0.1f, "o_b");
    sinks_ = upload_bf16({Hq()}, 1.0f, "sinks");
    router_w_ = upload_bf16({E(), H()}, w_scale, "router_w");
    router_b_ = upload_bf16({E()}, 0.1f, "router_b");
    // Experts as the checkpoint stores them (MXFP4 blocks + E8M0 scales), expanded on the device by
    // the backend's upload; scales 2^-4 keep the SwiGLU inputs in range.
    auto experts = [&](int64_t out, int64_t in, const char* name, std::vector<std::vector<uint8_t>>& keep,
                       std::vector<uint16_t>& bias) {
      HostExperts x;
      x.format = HostExperts::Format::Mxfp4;
      x.experts = E();
      x.out = out;
      x.in = in;
      keep.push_back(rng_.bytes(size_t(E() * out * in / 2)));
      keep.push_back(std::vector<uint8_t>(size_t(E() * out * in / 32), uint8_t(127 - 4)));
      x.blocks =
          host_view(keep[keep.size() - 2].data(), DType::U8, {E(), out, in / 32, 16}, std::string(name) + "_blocks");
      x.scales = host_view(keep.back().data(), DType::U8, {E(), out, in / 32}, std::string(name) + "_scales");
      bias = rng_.bf16(size_t(E() * out), 0.1f);
      x.bias = host_view(bias.data(), DType::BF16, {E(), out}, std::string(name) + "_bias");
      return x;
    };
    std::vector<std::vector<uint8_t>> keep;
    std::vector<uint16_t> gu_bias, down_bias;
    const HostExperts gate_up = experts(2 * I(), H(), "gate_up", keep, gu_bias);
    const HostExperts down = experts(H(), I(), "down", keep, down_bias);
    experts_ = backend_->upload_experts_as(gate_up, down, WeightFormat::Reference);
    // The same checkpoint bytes kept 4-bit (--quantization mxfp4), for the moe_mxfp4 cases.
    experts_mxfp4_ = backend_->upload_experts_as(gate_up, down, WeightFormat::Mxfp4);
    backend_->sync();
  }

  void allocate_activations() {
    const int64_t T = max_tokens_, R = std::max(max_decode_, 1);
    residual_ = random_activation(DType::F32, {T, H()}, 1.0f);
    normed_ = random_activation(DType::BF16, {T, H()}, 1.0f);
    qkv_ = random_activation(DType::BF16, {std::max<int64_t>(T, 8192), qkv_width()}, 1.0f);
    attn_ = random_activation(DType::BF16, {T, Hq() * D()}, 1.0f);
    attn_out_ = random_activation(DType::BF16, {T, H()}, 1.0f);
    moe_out_ = random_activation(DType::BF16, {T, H()}, 1.0f);
    router_ids_ = backend_->alloc(DType::I32, {T, K()});
    router_weights_ = backend_->alloc(DType::F32, {T, K()});
    ids_ = backend_->alloc(DType::I32, {T, K()});
    weights_ = random_activation(DType::F32, {T, K()}, 1.0f);
    logit_in_ = random_activation(DType::F32, {R, H()}, 1.0f);
    final_ = random_activation(DType::BF16, {R, H()}, 1.0f);
    logits_ = random_activation(DType::F32, {R, V()}, 4.0f);
    sample_params_ = backend_->alloc(DType::I32, {R, int64_t(sizeof(::ossrt::cuda::SampleRowParams) / 4)});
    ::ossrt::cuda::SampleRowParams greedy{};  // temperature 0: greedy, unmasked
    greedy.mask_slot = -1;
    std::vector<::ossrt::cuda::SampleRowParams> params(size_t(R), greedy);
    backend_->from_host(sample_params_, params.data());
    sample_ids_ = backend_->alloc(DType::I32, {R});
    sample_workspace_ = backend_->alloc(DType::U8, {int64_t(::ossrt::cuda::sample_workspace_bytes(int(R)))});
  }

  // One full-attention and one sliding layer of KV storage: the decode sequences (each with
  // decode_context cached positions, written by rope_and_cache_write from random q/k/v so no
  // attention runs on zeros) and one prefill sequence after them.
  void allocate_and_fill_kv() {
    const int B = std::max(max_decode_, 1), ctx = o_.decode_context;
    fill_chunk_ = std::max(1, std::min(ctx, 8192 / B));
    decode_full_blocks_ = (ctx + 1 + kBlock - 1) / kBlock + 1;
    decode_ring_ = window_ring_blocks(c_.sliding_window, std::max(fill_chunk_, 1), kBlock);
    prefill_full_blocks_ = (std::max(max_prefill_, 1) + kBlock - 1) / kBlock + 1;
    prefill_ring_ = window_ring_blocks(c_.sliding_window, std::max(max_prefill_, 1), kBlock);
    KvCacheShape shape;
    shape.num_full_layers = 1;
    shape.num_sliding_layers = 1;
    shape.num_full_blocks = B * decode_full_blocks_ + prefill_full_blocks_;
    shape.num_window_blocks = B * decode_ring_ + prefill_ring_;
    shape.block_size = kBlock;
    shape.num_kv_heads = int(Hkv());
    shape.head_dim = int(D());
    backend_->allocate_kv_cache(shape);
    for (int begin = 0; begin < ctx; begin += fill_chunk_) {
      const int n = std::min(fill_chunk_, ctx - begin);
      StepPlan plan;
      for (int s = 0; s < B; ++s) {
        std::vector<int32_t> tokens(static_cast<size_t>(n));
        for (auto& t : tokens) t = int32_t(rng_.next() % 199998);
        append_sequence_step(plan, decode_layout(s), tokens, begin, c_.sliding_window, false);
      }
      backend_->begin_step(plan);
      Tensor q = qkv_.rows(0, plan.num_tokens());
      backend_->rope_and_cache_write(q, rope_, attention_params(KvGroup::Full));
      backend_->rope_and_cache_write(q, rope_, attention_params(KvGroup::Sliding));
    }
    backend_->sync();
  }

  LinearKvLayout decode_layout(int s) const {
    return {kBlock, s * decode_full_blocks_, s * decode_ring_, decode_ring_};
  }
  LinearKvLayout prefill_layout() const {
    const int B = std::max(max_decode_, 1);
    return {kBlock, B * decode_full_blocks_, B * decode_ring_, prefill_ring_};
  }
  AttentionParams attention_params(KvGroup group) const {
    AttentionParams ap;
    ap.group = group;
    ap.layer_in_group = 0;
    ap.window = group == KvGroup::Sliding ? c_.sliding_window : 0;
    ap.num_q_heads = int(Hq());
    ap.num_kv_heads = int(Hkv());
    ap.head_dim = int(D());
    ap.sm_scale = float(1.0 / std::sqrt(double(D())));
    return ap;
  }

  // Random expert ids (k distinct per token) for the MoE case; returns the distinct experts touched.
  double upload_random_ids(int64_t T) {
    std::vector<int32_t> ids(size_t(T * K()));
    std::set<int32_t> distinct;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> chosen;
      while (int64_t(chosen.size()) < K()) {
        const int32_t e = int32_t(rng_.next() % uint64_t(E()));
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      for (int64_t j = 0; j < K(); ++j) {
        ids[size_t(t * K() + j)] = chosen[size_t(j)];
        distinct.insert(chosen[size_t(j)]);
      }
    }
    Tensor rows = ids_.rows(0, T);
    backend_->from_host(rows, ids.data());
    return double(distinct.size());
  }

  bool wanted(const std::string& op) const {
    return o_.ops.empty() || std::find(o_.ops.begin(), o_.ops.end(), op) != o_.ops.end();
  }

  void run_case(const std::string& phase, int tokens, int seqs, int context) {
    StepPlan plan;
    if (phase == "decode") {
      for (int s = 0; s < seqs; ++s) {
        const int32_t id = int32_t(rng_.next() % 199998);
        append_sequence_step(plan, decode_layout(s), std::span<const int32_t>(&id, 1), context, c_.sliding_window,
                             false);
      }
    } else {
      std::vector<int32_t> ids(static_cast<size_t>(tokens));
      for (auto& t : ids) t = int32_t(rng_.next() % 199998);
      append_sequence_step(plan, prefill_layout(), ids, 0, c_.sliding_window, false);
    }
    const int64_t T = plan.num_tokens(), R = int64_t(plan.logit_rows.size());
    backend_->begin_step(plan);
    const float eps = float(c_.rms_norm_eps);
    const SwigluParams swiglu{float(c_.swiglu_alpha), float(c_.swiglu_limit)};
    Tensor x = residual_.rows(0, T), normed = normed_.rows(0, T), qkv = qkv_.rows(0, T), attn = attn_.rows(0, T);
    Tensor attn_out = attn_out_.rows(0, T), moe_out = moe_out_.rows(0, T), ids = ids_.rows(0, T);
    Tensor weights = weights_.rows(0, T), rids = router_ids_.rows(0, T), rweights = router_weights_.rows(0, T);
    Tensor logit_in = logit_in_.rows(0, R), final = final_.rows(0, R), logits = logits_.rows(0, R);
    const AttentionParams full = attention_params(KvGroup::Full), sliding = attention_params(KvGroup::Sliding);
    // The step's own K/V must be in the cache before attention reads it (prefill reads its own rows).
    backend_->rope_and_cache_write(qkv, rope_, full);
    backend_->rope_and_cache_write(qkv, rope_, sliding);
    const double distinct = upload_random_ids(T);
    backend_->sync();

    auto add = [&](const std::string& op, const std::string& kernels, const OpCost& cost,
                   const std::function<void()>& fn, double experts = 0) {
      if (!wanted(op)) return;
      KernelResult r;
      r.model = c_.name;
      r.op = op;
      r.kernels = kernels;
      r.phase = phase;
      r.tokens = int(T);
      r.seqs = seqs;
      r.context = context;
      r.bytes = cost.bytes;
      r.flops = cost.flops;
      r.distinct_experts = experts;
      r.floor_s = floor_seconds(cost, machine_.copy_bytes_per_s, machine_.bf16_flops_per_s);
      r.bound = cost.flops / machine_.bf16_flops_per_s > cost.bytes / machine_.copy_bytes_per_s ? "compute" : "memory";
      try {
        const auto samples = timer_->time(o_.warmup, o_.iterations, fn);
        r.median_s = percentile(samples, 50);
        r.p10_s = percentile(samples, 10);
        r.p90_s = percentile(samples, 90);
      } catch (const std::exception& e) {
        out_.errors.push_back(fmt::format("{} {} {} tokens: {}", c_.name, op, T, e.what()));
        spdlog::error("{}", out_.errors.back());
        return;
      }
      std::fprintf(stderr, "%s %-18s %-8s %6lld tokens: %9.1f us (floor %8.1f us, x%.2f)\n", c_.name.c_str(),
                   op.c_str(), phase.c_str(), (long long)T, r.median_s * 1e6, r.floor_s * 1e6, r.ratio());
      out_.cases.push_back(std::move(r));
    };
    auto& b = *backend_;
    add("embedding", "bf16_embedding_gather", embedding_cost(T, H()), [&] { b.embedding(embed_, x); });
    add("rmsnorm", "f32_rmsnorm", rmsnorm_cost(T, H()), [&] { b.rmsnorm(x, norm_w_, eps, normed); });
    add("qkv_linear", "cuBLASLt bf16 GEMM + bias", linear_cost(T, qkv_width(), H(), true, kBf16),
        [&] { b.linear(normed, qkv_w_, &qkv_b_, qkv); });
    const double full_cache_bytes = kv_fp8_ ? kFp8 : kBf16;
    const std::string on_cache = kv_fp8_ ? " (e4m3 KV)" : "";
    add("rope_kv_write", "bf16_rope_kv_cache_write" + on_cache, rope_cache_cost(T, Hq(), Hkv(), D(), full_cache_bytes),
        [&] { b.rope_and_cache_write(qkv, rope_, full); });
    const std::string attn_kernels =
        phase == "decode" ? "bf16_sdpa_sinks_d64_decode + _combine" : "bf16_sdpa_sinks_d64_prefill";
    const int64_t q_tokens = phase == "decode" ? 1 : T;
    add("attention_full", attn_kernels + on_cache,
        attention_cost(seqs, q_tokens, context, 0, Hq(), Hkv(), D(), full_cache_bytes),
        [&] { b.attention(qkv, sinks_, full, attn); });
    add("attention_sliding", attn_kernels, attention_cost(seqs, q_tokens, context, c_.sliding_window, Hq(), Hkv(), D()),
        [&] { b.attention(qkv, sinks_, sliding, attn); });
    add("o_linear", "cuBLASLt bf16 GEMM + bias", linear_cost(T, H(), Hq() * D(), true, kBf16),
        [&] { b.linear(attn, o_w_, &o_b_, attn_out); });
    add("add_rmsnorm", "f32_rmsnorm (fused residual add)", add_rmsnorm_cost(T, H()),
        [&] { b.add_rmsnorm(x, attn_out, norm_w_, eps, normed); });
    add("router_topk", "cuBLASLt f32-out GEMM + f32_router_topk_softmax", router_cost(T, E(), H(), K()),
        [&] { b.router_topk(normed, router_w_, router_b_, int(K()), rids, rweights); });
    add(
        "moe", "moe_count/plan/scatter + bf16_bf16w_moe_gate_up_swiglu + _down + moe_combine",
        moe_cost(T, K(), distinct, H(), I()), [&] { b.moe(normed, experts_, ids, weights, swiglu, moe_out); },
        distinct);
    add(
        "moe_mxfp4",
        ::ossrt::cuda::choose_mxfp4_regime(int(T), int(K()), int(E()),
                                           ::ossrt::cuda::mxfp4_pipe_takes_large_m(int(H()), int(I()))) ==
                ::ossrt::cuda::MoeRegime::SmallM
            ? "moe_count/plan/scatter + bf16_mxfp4w_moe_gate_up_swiglu_decode + _down_decode + moe_combine"
            : "moe_count/plan/scatter + bf16_mxfp4w_moe_gate_up_swiglu + _down + moe_combine",
        moe_cost(T, K(), distinct, H(), I(), kMxfp4),
        [&] { b.moe(normed, experts_mxfp4_, ids, weights, swiglu, moe_out); }, distinct);
    add("add", "f32_rmsnorm (add only)", add_cost(T, H()), [&] { b.add(x, moe_out); });
    add("gather_logit_rows", "gather_rows", gather_rows_cost(R, H()), [&] { b.gather_logit_rows(x, logit_in); });
    add("lm_head_linear", "cuBLASLt bf16 GEMM, f32 out", linear_cost(R, V(), H(), false, kF32),
        [&] { b.linear(final, lm_head_, nullptr, logits); });
    add("sample_greedy", "f32_sample_argmax_partial + f32_sample_topk_topp", sample_cost(R, V()), [&] {
      ::ossrt::cuda::SampleArgs a{logits.ptr<float>(),
                                  static_cast<const ::ossrt::cuda::SampleRowParams*>(sample_params_.data),
                                  /*masks=*/nullptr,
                                  sample_ids_.ptr<int32_t>(),
                                  int(R),
                                  int(V()),
                                  /*mask_words=*/0,
                                  static_cast<::ossrt::cuda::SampleArgmaxPartial*>(sample_workspace_.data)};
      OSSRT_CUDA_CHECK(::ossrt::cuda::launch_f32_sample_topk_topp(a, b.stream()));
    });
  }

  const KernelBenchOptions& o_;
  GptOssConfig c_;
  const MachineRates& machine_;
  KernelBenchResult& out_;
  HostRandom rng_{12345};
  int max_decode_ = 0, max_prefill_ = 0, max_tokens_ = 1;
  bool kv_fp8_ = false;  // the full layers' KV cache is e4m3 (--kv-cache-dtype fp8)
  int fill_chunk_ = 1, decode_full_blocks_ = 0, decode_ring_ = 0, prefill_full_blocks_ = 0, prefill_ring_ = 0;
  std::unique_ptr<CudaBackend> backend_;
  std::unique_ptr<OpTimer> timer_;
  RopeParams rope_;
  Tensor embed_, lm_head_, norm_w_, qkv_w_, qkv_b_, o_w_, o_b_, sinks_, router_w_, router_b_;
  ExpertWeights experts_, experts_mxfp4_;
  Tensor residual_, normed_, qkv_, attn_, attn_out_, moe_out_, router_ids_, router_weights_, ids_, weights_;
  Tensor logit_in_, final_, logits_, sample_params_, sample_ids_, sample_workspace_;
};

}  // namespace

KernelBenchResult run_kernel_bench(const KernelBenchOptions& o) {
  OSSRT_CHECK(CudaBackend::device_available(),
              "`ossrt bench kernels` needs a CUDA GPU and none is visible (the CPU machine builds it; run it on the "
              "device: tools/device/bench_h200.sh)");
  OSSRT_CHECK(o.iterations > 0 && o.warmup >= 0, "--iterations must be positive and --warmup >= 0");
  OSSRT_CHECK(o.decode_context > 0, "--decode-context must be positive");
  OSSRT_CUDA_CHECK(cudaSetDevice(o.device));
  KernelBenchResult r;
  r.date = utc_now();
  r.commit = build_commit();
  r.settings = {{"models", o.models},
                {"decode_tokens", o.decode_tokens},
                {"prefill_tokens", o.prefill_tokens},
                {"decode_context", o.decode_context},
                {"iterations", o.iterations},
                {"warmup", o.warmup},
                {"ops", o.ops},
                {"kv_cache_dtype", o.kv_cache_dtype},
                {"device", o.device}};
  r.machine = measure_machine(o.device);
  spdlog::info("bench kernels: {}: copy {:.2f} TB/s, bf16 GEMM {:.0f} TFLOP/s, L2 {:.0f} MiB", r.machine.gpu,
               r.machine.copy_bytes_per_s / 1e12, r.machine.bf16_flops_per_s / 1e12, r.machine.l2_bytes / 1048576.0);
  for (const auto& model : o.models) {
    try {
      ModelBench bench(o, model, r.machine, r);
      bench.run_all();
    } catch (const std::exception& e) {
      r.errors.push_back(fmt::format("{}: {}", model, e.what()));
      spdlog::error("bench kernels: {}", r.errors.back());
    }
  }
  return r;
}

void run_kernel_bench_command(const KernelBenchOptions& o) {
  const KernelBenchResult r = run_kernel_bench(o);
  if (!o.result_dir.empty())
    for (const auto& path : write_kernel_results(r, o.result_dir)) std::fprintf(stderr, "wrote %s\n", path.c_str());
  std::fputs(format_kernel_table(r).c_str(), stdout);
  for (const auto& e : r.errors) std::fprintf(stdout, "error: %s\n", e.c_str());
  std::fflush(stdout);
}

}  // namespace ossrt::bench
