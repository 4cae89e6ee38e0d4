// CudaBackend: construction, the start-up memory plan, host <-> device transfers, the KV cache and
// the per-step plan upload. The ops are in cuda_ops.cpp, weight conversion in cuda_weights.cpp,
// graphs in cuda_graphs.cpp, sampling in cuda_sampling.cpp.
#include "backend/cuda/cuda_backend.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <utility>

#include "backend/cuda/cublas_fp8.h"
#include "backend/cuda/cublas_linear.h"
#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_graphs.h"
#include "backend/cuda/device_buffers.h"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/fp8_linear.cuh"
#include "backend/cuda/kernels/gemv.cuh"
#include "backend/cuda/kernels/router.cuh"
#include "backend/cuda/kernels/sample.cuh"
#include "backend/cuda/plan_upload.h"
#include "backend/cuda/step_timing.h"
#include "backend/graph_plan.h"
#include "backend/kv_cache_scales.h"

namespace ossrt {

namespace {
// Decode buckets reach 256 sequences whatever max_seqs says, so the plan buffers hold them.
constexpr int kMinPlanSeqs = 256;
// Attention kernels are built for gpt-oss's 64 query heads (both models); the decode workspace is
// sized for them.
constexpr int kPlannedQueryHeads = 64;
// The sampler's mask room is planned for gpt-oss's vocabulary (both models): 6,284 words, 25 KB, a row.
constexpr size_t kPlannedVocab = 201088;
// Left free beyond the KV budget: CUDA graph executables (one per decode or verify key, captured
// after the plan), cuBLASLt's internal state, kernels first loaded by decode steps, fragmentation. The
// profiling step already counts everything a prefill-and-decode step allocates.
constexpr size_t kGraphsAndLibrariesReserveBytes = size_t(512) << 20;
}  // namespace

bool CudaBackend::device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

CudaBackend::CudaBackend(const BackendOptions& options) : options_(options), device_(options.device_index) {
  OSSRT_CHECK(device_available(), "--backend cuda: no CUDA device is visible");
  OSSRT_CHECK(options.max_step_tokens >= 1 && options.max_seqs >= 1, "CUDA backend: max_step_tokens {} / max_seqs {}",
              options.max_step_tokens, options.max_seqs);
  OSSRT_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  OSSRT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  OSSRT_CHECK(prop.major >= 9, "CUDA backend needs sm_90 (Hopper); device {} is {} (sm_{}{})", device_, prop.name,
              prop.major, prop.minor);
  num_sms_ = prop.multiProcessorCount;
  device_description_ = fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB)", prop.name, prop.major, prop.minor, num_sms_,
                                    double(prop.totalGlobalMem) / double(1ull << 30));
  cudaStream_t s = nullptr;
  OSSRT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;

  buffers_ = std::make_unique<cuda::DeviceBuffers>();
  blas_ = std::make_unique<cuda::CublasLinear>(*buffers_);
  cuda::PlanCapacity cap;
  cap.max_tokens = options.max_step_tokens;
  cap.max_seqs = std::max(options.max_seqs, kMinPlanSeqs);
  plan_ = std::make_unique<cuda::StepPlanUploader>(*buffers_, cap);
  graphs_ = std::make_unique<cuda::StepGraphCache>(*this);

  router_logits_bytes_ = size_t(cap.max_tokens) * cuda::kRouterMaxExperts * sizeof(float);
  router_logits_ = device_alloc(router_logits_bytes_, "router logits workspace");
  router_counter_ = static_cast<int*>(device_alloc(sizeof(int), "router ticket counter"));
  OSSRT_CUDA_CHECK(cudaMemsetAsync(router_counter_, 0, sizeof(int), stream_));
  moe_tickets_ = static_cast<int32_t*>(device_alloc(sizeof(int32_t) * kMoeTickets, "MoE combine tickets"));
  OSSRT_CUDA_CHECK(cudaMemsetAsync(moe_tickets_, 0, sizeof(int32_t) * kMoeTickets, stream_));
  // One ticket per (sequence, KV head) for the decode attention's folded split merge; a query head
  // per KV head at most, so kPlannedQueryHeads per sequence cover any grouping.
  attn_tickets_capacity_ = int64_t(cap.max_seqs) * kPlannedQueryHeads;
  attn_tickets_ = static_cast<int32_t*>(device_alloc(sizeof(int32_t) * attn_tickets_capacity_, "attention tickets"));
  OSSRT_CUDA_CHECK(cudaMemsetAsync(attn_tickets_, 0, sizeof(int32_t) * attn_tickets_capacity_, stream_));
  fp8_split_partials_ = static_cast<float*>(
      device_alloc(sizeof(float) * size_t(cuda::kFp8SplitPartialFloats), "FP8 GEMV split partials"));
  fp8_split_tickets_ =
      static_cast<int32_t*>(device_alloc(sizeof(int32_t) * size_t(cuda::kFp8SplitMaxTiles), "FP8 GEMV split tickets"));
  OSSRT_CUDA_CHECK(cudaMemsetAsync(fp8_split_tickets_, 0, sizeof(int32_t) * size_t(cuda::kFp8SplitMaxTiles), stream_));
  greedy_keys_ = static_cast<unsigned long long*>(device_alloc(cuda::greedy_argmax_key_bytes(), "greedy argmax keys"));
  OSSRT_CUDA_CHECK(cudaMemsetAsync(greedy_keys_, 0, cuda::greedy_argmax_key_bytes(), stream_));
  greedy_ids_ = static_cast<int32_t*>(device_alloc(sizeof(int32_t) * cuda::kGreedyMaxRows, "greedy argmax ids"));
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  attn_workspace_bytes_ =
      cuda::attention_decode_workspace_bytes(cap.max_seqs, kPlannedQueryHeads, cuda::kAttnMaxDecodeSplits);
  attn_workspace_ = device_alloc(attn_workspace_bytes_, "attention decode workspace");
  max_sample_rows_ = std::max(cap.max_tokens, cap.max_seqs);
  // Masks are planned for max_seqs rows, not max_sample_rows_: the engine samples at most one row
  // per running sequence (max_logit_rows = max_num_seqs), and max_step_tokens rows of 25 KB would
  // hold 50-200 MB of device and pinned memory for rows that never come. Smaller vocabularies
  // (tests) fit proportionally more rows.
  sample_mask_words_ = size_t(cap.max_seqs) * ((kPlannedVocab + 31) / 32);
  const size_t upload_bytes =
      size_t(max_sample_rows_) * sizeof(SamplingRowParams) + sample_mask_words_ * sizeof(uint32_t);
  sample_upload_ = device_alloc(upload_bytes, "sampling parameters and token masks");
  sample_staging_ = static_cast<char*>(buffers_->allocate_pinned(upload_bytes, "sampling upload staging"));
  sample_ids_ = device_alloc(size_t(max_sample_rows_) * sizeof(int32_t), "sampled ids");
  sample_workspace_ = device_alloc(cuda::sample_workspace_bytes(max_sample_rows_), "sampling workspace");
  // Developer switch for A/B timing of the decode GEMVs and fused router against cuBLASLt:
  // OSSRT_CUDA_GEMV_MAX_ROWS=0 sends every linear and router GEMM to cuBLASLt (docs/kernels.md).
  if (const char* rows = std::getenv("OSSRT_CUDA_GEMV_MAX_ROWS")) {
    OSSRT_CHECK(
        std::sscanf(rows, "%d", &gemv_max_rows_) == 1 && gemv_max_rows_ >= 0 && gemv_max_rows_ <= cuda::kGemvMaxRows,
        "OSSRT_CUDA_GEMV_MAX_ROWS must be 0..{}, not '{}'", cuda::kGemvMaxRows, rows);
  }
  // OSSRT_CUDA_MOE_DIRECT_MAX_PAIRS=0 sends one- and two-token MXFP4 MoE steps through the route pass.
  if (const char* pairs = std::getenv("OSSRT_CUDA_MOE_DIRECT_MAX_PAIRS")) {
    OSSRT_CHECK(std::sscanf(pairs, "%d", &moe_direct_max_pairs_) == 1 && moe_direct_max_pairs_ >= 0,
                "OSSRT_CUDA_MOE_DIRECT_MAX_PAIRS must be a non-negative integer, not '{}'", pairs);
  }
  if (const char* fold = std::getenv("OSSRT_CUDA_MOE_FOLD")) moe_fold_combine_ = fold[0] != '0';
  if (const char* v = std::getenv("OSSRT_CUDA_FP8_MOE_WGMMA")) fp8_moe_wgmma_ = v[0] != '0';
  if (const char* fold = std::getenv("OSSRT_CUDA_ATTN_FOLD")) attn_fold_merge_ = fold[0] != '0';
  if (const char* cache = std::getenv("OSSRT_CUDA_ATTN_BLOCK_CACHE")) attn_cache_split_blocks_ = cache[0] != '0';
  if (const char* v = std::getenv("OSSRT_CUDA_ATTN_DECODE_PLAIN")) attn_decode_plain_form_ = v[0] != '0';
  if (const char* v = std::getenv("OSSRT_CUDA_ATTN_SHORT_SEQS")) attn_short_seqs_as_decode_ = v[0] != '0';
  if (const char* keys = std::getenv("OSSRT_CUDA_ATTN_SPLIT_KEYS")) {
    OSSRT_CHECK(std::sscanf(keys, "%d", &attn_min_split_keys_) == 1 && attn_min_split_keys_ >= 64 &&
                    attn_min_split_keys_ % 64 == 0,
                "OSSRT_CUDA_ATTN_SPLIT_KEYS must be a positive multiple of 64, not '{}'", keys);
  }
  if (const char* ring = std::getenv("OSSRT_CUDA_ATTN_DECODE_RING")) {
    OSSRT_CHECK(std::sscanf(ring, "%d", &attn_decode_ring_) == 1 && cuda::is_decode_ring(attn_decode_ring_),
                "OSSRT_CUDA_ATTN_DECODE_RING must be 2, 3, 4 or 6, not '{}'", ring);
  }
  if (const char* splits = std::getenv("OSSRT_CUDA_ATTN_MAX_SPLITS")) {
    OSSRT_CHECK(std::sscanf(splits, "%d", &attn_max_splits_) == 1 && attn_max_splits_ >= 1 &&
                    attn_max_splits_ <= cuda::kAttnMaxDecodeSplits,
                "OSSRT_CUDA_ATTN_MAX_SPLITS must be 1..{}, not '{}'", cuda::kAttnMaxDecodeSplits, splits);
  }
  // Before any graph capture: the decode attention's rings need a raised shared-memory limit.
  cuda::attention_decode_prepare();
  if (const char* mma = std::getenv("OSSRT_CUDA_FP8_GEMV_MMA")) {
    const std::string v = mma;
    OSSRT_CHECK(v == "0" || v == "1" || v == "all", "OSSRT_CUDA_FP8_GEMV_MMA must be 0, 1 or all, not '{}'", v);
    fp8_mma_from_rows_ = v == "0" ? cuda::kFp8GemvMaxRows + 1 : v == "all" ? 1 : 2;
  }
  if (const char* fused = std::getenv("OSSRT_CUDA_FP8_QKV_ROPE")) fp8_qkv_rope_ = fused[0] != '0';
  if (const char* fold = std::getenv("OSSRT_CUDA_QKV_NORM_FOLD")) qkv_norm_fold_ = fold[0] == '1';
  if (const char* codes = std::getenv("OSSRT_CUDA_FP8_NORM_CODES")) fp8_norm_codes_ = codes[0] != '0';
  if (const char* fold = std::getenv("OSSRT_CUDA_ROUTER_NORM_FOLD")) router_norm_fold_ = fold[0] == '1';
  if (const char* drop = std::getenv("OSSRT_CUDA_MOE_DROP_PADDING")) moe_drop_padding_ = drop[0] != '0';
  if (const char* greedy = std::getenv("OSSRT_CUDA_FUSED_GREEDY")) fused_greedy_enabled_ = greedy[0] == '1';
  if (const char* screen = std::getenv("OSSRT_CUDA_GREEDY_SCREEN")) greedy_screen_enabled_ = screen[0] == '1';
  // OSSRT_CUDA_GRAPHS=0: every step eager (vLLM's --enforce-eager), to tell a graph problem from a kernel one.
  if (const char* graphs = std::getenv("OSSRT_CUDA_GRAPHS")) graphs_enabled_ = graphs[0] != '0';
  if (const char* split = std::getenv("OSSRT_CUDA_FP8_GEMV_SPLIT")) fp8_gemv_split_ = split[0] != '0';
  if (const char* ablate = std::getenv("OSSRT_CUDA_ABLATE")) {
    static const std::pair<const char*, Ablate> kOps[] = {
        {"norm", kAblateNorm},     {"qkv", kAblateQkv},        {"attention", kAblateAttention},
        {"linear", kAblateLinear}, {"lm_head", kAblateLmHead}, {"router", kAblateRouter},
        {"moe", kAblateMoe}};
    std::string list = ablate;
    for (size_t begin = 0; begin <= list.size();) {
      const size_t end = std::min(list.find(',', begin), list.size());
      const std::string op = list.substr(begin, end - begin);
      begin = end + 1;
      if (op.empty()) continue;
      const auto* it = std::find_if(std::begin(kOps), std::end(kOps), [&](const auto& o) { return op == o.first; });
      OSSRT_CHECK(it != std::end(kOps),
                  "OSSRT_CUDA_ABLATE: unknown op '{}' (norm, qkv, attention, linear, lm_head, router, moe)", op);
      ablate_ |= it->second;
    }
    spdlog::warn("cuda: OSSRT_CUDA_ABLATE={}: those ops launch nothing, outputs are garbage (timing only)", list);
  }
  if (const char* window = std::getenv("OSSRT_CUDA_PROFILE_DECODE_STEPS")) {
    OSSRT_CHECK(std::sscanf(window, "%d:%d", &profile_first_, &profile_count_) == 2 && profile_first_ >= 0 &&
                    profile_count_ > 0,
                "OSSRT_CUDA_PROFILE_DECODE_STEPS must be first:count (two non-negative integers, count > 0), not '{}'",
                window);
  }
  if (cuda::StepTimer::enabled_by_environment()) step_timer_ = std::make_unique<cuda::StepTimer>(stream_);
  spdlog::info("cuda: {} ({} SMs), workspaces {:.1f} MiB planned for {} tokens / {} sequences per step", prop.name,
               num_sms_, buffers_->device_bytes() / 1048576.0, cap.max_tokens, cap.max_seqs);
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);  // bind_device() may throw; a destructor must not
  if (stream_) cudaStreamSynchronize(stream_);
  step_timer_.reset();
  graphs_.reset();
  blas_fp8_.reset();
  blas_.reset();
  plan_.reset();
  buffers_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

// cudaGetDevice reads a thread-local: cheap enough for every entry point, ops included.
void CudaBackend::bind_device() const {
  int current = -1;
  OSSRT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device_) OSSRT_CUDA_CHECK(cudaSetDevice(device_));
}

void* CudaBackend::device_alloc(size_t bytes, const char* what) { return buffers_->allocate(bytes, what, stream_); }

size_t CudaBackend::device_bytes_allocated() const { return buffers_->device_bytes(); }

Tensor CudaBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  bind_device();
  Tensor t(nullptr, dtype, shape, Device::CUDA);
  for (int i = 0; i < t.ndim; ++i) OSSRT_CHECK(t.shape[i] >= 0, "alloc: negative dimension in {}", t.shape_str());
  t.data = device_alloc(t.bytes(), "activation workspace");
  return t;
}

void CudaBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  OSSRT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  // Host sources may be freed right after return (conversion buffers): finish the copy first.
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::to_host(const Tensor& t, void* dst) {
  bind_device();
  OSSRT_CHECK(t.device == Device::CUDA, "to_host: tensor {} is not on the CUDA device", t.shape_str());
  OSSRT_CHECK(fused_greedy_.logits_written || t.data != fused_greedy_.logits,
              "to_host: the logits of a greedy-only step (StepPlan::greedy_ids_only) were not computed");
  if (t.bytes() == 0) return;
  OSSRT_CUDA_CHECK(cudaMemcpyAsync(dst, t.data, t.bytes(), cudaMemcpyDeviceToHost, stream_));
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<float> CudaBackend::to_host_f32(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  switch (t.dtype) {
    case DType::F32: to_host(t, out.data()); break;
    case DType::BF16: {
      std::vector<uint16_t> raw(out.size());
      to_host(t, raw.data());
      for (size_t i = 0; i < raw.size(); ++i) out[i] = bf16_to_f32(raw[i]);
      break;
    }
    case DType::I32: {
      std::vector<int32_t> raw(out.size());
      to_host(t, raw.data());
      for (size_t i = 0; i < raw.size(); ++i) out[i] = float(raw[i]);
      break;
    }
    default: fail("to_host_f32: unsupported dtype {}", dtype_name(t.dtype));
  }
  return out;
}

void CudaBackend::from_host(Tensor& t, const void* src) {
  bind_device();
  OSSRT_CHECK(t.device == Device::CUDA, "from_host: tensor {} is not on the CUDA device", t.shape_str());
  copy_to_device(t.data, src, t.bytes());
}

void CudaBackend::sync() {
  bind_device();
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- KV cache

size_t CudaBackend::kv_block_bytes(const KvCacheShape& s) const {
  return 2 * size_t(s.num_kv_heads) * size_t(s.block_size) * size_t(s.head_dim) * sizeof(uint16_t);
}

size_t CudaBackend::kv_full_block_bytes(const KvCacheShape& s) const {
  if (options_.kv_cache_dtype != KvCacheDtype::Fp8E4m3) return kv_block_bytes(s);
  return 2 * size_t(s.num_kv_heads) * size_t(s.block_size) * size_t(s.head_dim) * sizeof(uint8_t);
}

void CudaBackend::release_kv_storage() {
  bind_device();
  if (!kv_) return;
  sync();
  graphs_->clear();  // captured graphs hold the old storage's addresses
  for (void* base : kv_->allocations) buffers_->release(base);
  kv_.reset();
}

void CudaBackend::allocate_kv_cache(const KvCacheShape& shape) {
  bind_device();
  OSSRT_CHECK(shape.head_dim == 64, "CUDA backend supports head_dim 64 only (got {})", shape.head_dim);
  OSSRT_CHECK(
      shape.block_size > 0 && shape.num_kv_heads > 0 && shape.num_full_blocks >= 0 && shape.num_window_blocks >= 0,
      "allocate_kv_cache: bad shape (block_size {}, kv heads {}, blocks {} / {})", shape.block_size, shape.num_kv_heads,
      shape.num_full_blocks, shape.num_window_blocks);
  const bool fp8 = options_.kv_cache_dtype == KvCacheDtype::Fp8E4m3;
  // fp8: the full layers' scales, K's [layers][Hkv] then V's (checked before anything is allocated).
  std::vector<float> scales;
  if (fp8) {
    scales = kv_cache_scales_or_ones(options_.kv_k_scales, shape.num_full_layers, shape.num_kv_heads, "K");
    const std::vector<float> v =
        kv_cache_scales_or_ones(options_.kv_v_scales, shape.num_full_layers, shape.num_kv_heads, "V");
    scales.insert(scales.end(), v.begin(), v.end());
  }
  release_kv_storage();
  kv_ = std::make_unique<KvStorage>();
  kv_->shape = shape;
  // One extra block per pool, invisible to the engine: padded graph rows write and read it.
  kv_->internal = shape;
  kv_->internal.num_full_blocks += 1;
  kv_->internal.num_window_blocks += 1;
  auto allocate_group = [&](KvStorage::Group& g, int layers, int blocks, size_t block_bytes, const char* what) {
    g.num_blocks = blocks;
    g.scratch_block = blocks - 1;
    const size_t half = block_bytes / 2 * size_t(blocks);  // K or V of one layer
    if (layers == 0) return;
    char* base =
        static_cast<char*>(buffers_->allocate(half * 2 * size_t(layers), what, stream_, cuda::BufferKind::KvCache));
    kv_->allocations.push_back(base);
    // Zeroed so never-written slots (the scratch block before first use) hold finite values.
    OSSRT_CUDA_CHECK(cudaMemsetAsync(base, 0, half * 2 * size_t(layers), stream_));
    for (int l = 0; l < layers; ++l) {
      g.k.push_back(base + half * 2 * size_t(l));
      g.v.push_back(base + half * (2 * size_t(l) + 1));
    }
  };
  allocate_group(kv_->full, shape.num_full_layers, kv_->internal.num_full_blocks, kv_full_block_bytes(shape),
                 "KV cache (full layers)");
  allocate_group(kv_->window, shape.num_sliding_layers, kv_->internal.num_window_blocks, kv_block_bytes(shape),
                 "KV cache (sliding layers)");
  if (fp8 && shape.num_full_layers > 0) {
    auto* d = static_cast<float*>(
        buffers_->allocate(scales.size() * sizeof(float), "KV cache scales", stream_, cuda::BufferKind::KvCache));
    kv_->allocations.push_back(d);
    copy_to_device(d, scales.data(), scales.size() * sizeof(float));
    kv_->full.elem = cuda::KvCacheElem::Fp8E4m3;
    const size_t per_layer = size_t(shape.num_kv_heads), v_begin = size_t(shape.num_full_layers) * per_layer;
    for (size_t l = 0; l < size_t(shape.num_full_layers); ++l) {
      kv_->full.k_scale.push_back(d + l * per_layer);
      kv_->full.v_scale.push_back(d + v_begin + l * per_layer);
    }
  }
  sync();
  spdlog::debug("cuda: KV cache {} full blocks x {} layers ({}), {} window blocks x {} layers ({:.1f} MiB)",
                shape.num_full_blocks, shape.num_full_layers, fp8 ? "fp8_e4m3" : "bf16", shape.num_window_blocks,
                shape.num_sliding_layers,
                (double(shape.num_full_blocks + 1) * shape.num_full_layers * double(kv_full_block_bytes(shape)) +
                 double(shape.num_window_blocks + 1) * shape.num_sliding_layers * double(kv_block_bytes(shape))) /
                    1048576.0);
}

const CudaBackend::KvStorage& CudaBackend::kv_storage(KvGroup) const {
  OSSRT_CHECK(kv_ != nullptr, "the KV cache is not allocated (call allocate_kv_cache first)");
  return *kv_;
}

MemoryUse CudaBackend::memory_use() const {
  bind_device();
  size_t free_b = 0, total_b = 0;
  OSSRT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  MemoryUse m;
  m.weights = buffers_->bytes(cuda::BufferKind::Weights);
  m.workspaces = buffers_->bytes(cuda::BufferKind::Workspace);
  m.kv_cache = buffers_->bytes(cuda::BufferKind::KvCache);
  m.capacity = total_b;
  m.in_use = total_b - free_b;
  m.reserve = kGraphsAndLibrariesReserveBytes;
  return m;
}

// ---- plan

void CudaBackend::begin_step(const StepPlan& plan) {
  bind_device();
  cuda::validate_step_plan(plan, plan_->capacity(), kv_ ? &kv_->internal : nullptr);
  plan_->upload(plan, stream_, /*copy=*/!graphs_->capturing());
  fused_greedy_ = {};  // a new step: its unembed (or a graph replay) says again what the ids are
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

}  // namespace ossrt

namespace ossrt {

void CudaBackend::profile_window(const StepPlan& plan) {
  if (profile_first_ < 0 || !plan.is_decode_only()) return;
  const int step = decode_steps_seen_++;
  if (step == profile_first_) OSSRT_CUDA_CHECK(cudaProfilerStart());
  if (step == profile_first_ + profile_count_) OSSRT_CUDA_CHECK(cudaProfilerStop());
}

Tensor CudaBackend::run_step(const StepPlan& plan, const StepFn& step) {
  bind_device();
  profile_window(plan);
  if (!step_timer_) return run_step_on_stream(plan, step);
  step_timer_->step_begin(plan.num_seqs(), uniform_seq_tokens(plan));
  Tensor logits = run_step_on_stream(plan, step);
  step_timer_->forward_enqueued();
  return logits;
}

Tensor CudaBackend::run_step_on_stream(const StepPlan& plan, const StepFn& step) {
  if (!graphs_enabled_) return step(plan);
  const GraphKey key = graphs_->key(plan);
  if (key.batch_bucket == 0) return step(plan);
  return graphs_->run(plan, key, step);
}

int CudaBackend::graph_count() const { return graphs_->size(); }

std::vector<cuda::GraphUse> CudaBackend::graph_uses() const { return graphs_->uses(); }

}  // namespace ossrt
