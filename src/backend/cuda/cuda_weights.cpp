// Weight conversion for the CUDA backend: everything becomes bf16 on the device (checkpoints are
// bf16 already; f32/f16 sources are rounded), expert biases become f32 (the MoE kernels add them in
// fp32). MXFP4 experts are expanded to bf16 on the device, once, at load time (WeightFormat::
// Reference), or stay 4-bit, repacked on the device into the MoE kernels' layout (Mxfp4, Mxfp4Fp8), or
// become e4m3 codes with 128x128 block scales, quantized and packed on the device (Fp8).
// The linear weights (upload_linear) of Fp8 / Mxfp4Fp8 become e4m3 codes with 128x128 block scales,
// quantized on the host with core/fp8.h, each checkpoint part on its own grid.
#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/cublas_fp8.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffers.h"
#include "backend/cuda/kernels/gemv.cuh"
#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/moe_fp8.cuh"
#include "backend/cuda/kernels/moe_mxfp4.cuh"
#include "backend/cuda/mxfp4_dequant.h"
#include "core/fp8.h"
#include "core/threads.h"

namespace ossrt {
namespace {

// gpt-oss routes every token to 4 experts (both models); the MoE workspace is planned for that.
constexpr int kPlannedTopK = 4;
// Expert chunk dequantized per staging round: bounds the temporary device memory at load time.
constexpr size_t kDequantStagingBytes = size_t(256) << 20;
// gpt-oss's widest linear input (o_proj: 64 heads x 64), for the FP8 activation workspace.
constexpr int kPlannedFp8KPad = 4096;

void check_float_dtype(const HostTensor& t) {
  OSSRT_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32 || t.dtype == DType::F16,
              "CUDA upload: tensor {} has dtype {}, expected bf16/f16/f32", t.name, dtype_name(t.dtype));
  OSSRT_CHECK(t.data != nullptr, "CUDA upload: tensor {} has no data", t.name);
}

// Elements [begin, begin + n) of t as bf16 bits, appended to dst.
void append_bf16(const HostTensor& t, int64_t begin, int64_t n, std::vector<uint16_t>& dst) {
  const size_t at = dst.size();
  dst.resize(at + size_t(n));
  if (t.dtype == DType::BF16) {
    const auto* src = static_cast<const uint16_t*>(t.data) + begin;
    std::copy(src, src + n, dst.begin() + std::ptrdiff_t(at));
    return;
  }
  std::vector<float> f(static_cast<size_t>(n));
  t.to_f32(begin, n, f.data());
  for (int64_t i = 0; i < n; ++i) dst[at + size_t(i)] = f32_to_bf16(f[size_t(i)]);
}

Tensor make_tensor(void* data, DType dtype, const std::vector<int64_t>& shape) {
  Tensor t(data, dtype, {}, Device::CUDA);
  OSSRT_CHECK(shape.size() <= size_t(kMaxDims), "tensor rank {} > {}", shape.size(), kMaxDims);
  for (int64_t d : shape) t.shape[t.ndim++] = d;
  return t;
}

}  // namespace

Tensor CudaBackend::upload(const HostTensor& src) {
  bind_device();
  check_float_dtype(src);
  Tensor t = make_tensor(nullptr, DType::BF16, src.shape);
  t.data = buffers_->allocate(t.bytes(), "weights", stream_, cuda::BufferKind::Weights);
  if (src.dtype == DType::BF16) {
    copy_to_device(t.data, src.data, t.bytes());  // straight from the mapped file
  } else {
    std::vector<uint16_t> host;
    host.reserve(size_t(src.numel()));
    append_bf16(src, 0, src.numel(), host);
    copy_to_device(t.data, host.data(), t.bytes());
  }
  return t;
}

Tensor CudaBackend::upload_concat_rows(std::span<const HostTensor* const> parts) {
  bind_device();
  OSSRT_CHECK(!parts.empty(), "upload_concat_rows: no parts");
  std::vector<int64_t> shape = parts[0]->shape;
  OSSRT_CHECK(!shape.empty(), "upload_concat_rows: {} is a scalar", parts[0]->name);
  int64_t rows = 0;
  std::vector<uint16_t> host;
  for (const HostTensor* p : parts) {
    check_float_dtype(*p);
    OSSRT_CHECK(p->shape.size() == shape.size() && std::equal(p->shape.begin() + 1, p->shape.end(), shape.begin() + 1),
                "upload_concat_rows: {} has a shape incompatible with {}", p->name, parts[0]->name);
    rows += p->shape[0];
    append_bf16(*p, 0, p->numel(), host);
  }
  shape[0] = rows;
  Tensor t = make_tensor(nullptr, DType::BF16, shape);
  t.data = buffers_->allocate(t.bytes(), "weights (concatenated)", stream_, cuda::BufferKind::Weights);
  copy_to_device(t.data, host.data(), t.bytes());
  return t;
}

Tensor CudaBackend::upload_linear(std::span<const HostTensor* const> parts) {
  const WeightFormat format = options_.weight_format;
  if (format != WeightFormat::Fp8 && format != WeightFormat::Mxfp4Fp8) return Backend::upload_linear(parts);
  bind_device();
  OSSRT_CHECK(!parts.empty() && parts.size() <= size_t(cuda::kFp8MaxParts), "upload_linear: {} parts (1 to {})",
              parts.size(), cuda::kFp8MaxParts);
  const int64_t k = parts[0]->shape.size() == 2 ? parts[0]->shape[1] : 0;
  auto w = std::make_unique<Fp8Weight>();
  int64_t n = 0, scale_rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const HostTensor& p = *parts[i];
    check_float_dtype(p);
    OSSRT_CHECK(p.shape.size() == 2 && p.shape[1] == k && k > 0,
                "upload_linear: '{}' is {} dimensions of width {}, expected matrices [out, {}]", p.name, p.shape.size(),
                p.shape.empty() ? 0 : p.shape.back(), k);
    w->parts.first_row[i] = int(n);
    w->parts.first_scale_row[i] = int(scale_rows);
    if (n % cuda::kFp8Block != 0) w->grid_aligned = false;
    n += p.shape[0];
    scale_rows += cuda::fp8_blocks(int(p.shape[0]));
  }
  w->parts.count = int(parts.size());
  w->n = int(n);
  w->k = int(k);
  w->k_pad = cuda::fp8_k_pad(int(k));
  const int64_t k_pad = w->k_pad, kb_pad = k_pad / cuda::kFp8Block;
  OSSRT_CHECK(n < (int64_t(1) << 31) && n * k_pad < (int64_t(1) << 40), "upload_linear: [{}, {}] is too large", n, k);

  // Host quantization (core/fp8.h, the CPU backend's rule): bands of 128 rows of a part are
  // independent blocks, one task each. The 120b unembedding is 580 M values.
  std::vector<uint8_t> codes(size_t(n * k_pad), 0);
  std::vector<float> scales(size_t(scale_rows * kb_pad), 0.0f);
  ThreadPool pool;
  for (size_t i = 0; i < parts.size(); ++i) {
    const HostTensor& p = *parts[i];
    const int64_t rows = p.shape[0], first_row = w->parts.first_row[i], first_scale_row = w->parts.first_scale_row[i];
    pool.parallel_for(cuda::fp8_blocks(int(rows)), [&](int64_t b, int64_t e) {
      std::vector<float> band;
      for (int64_t blk_row = b; blk_row < e; ++blk_row) {
        const int64_t r0 = blk_row * kFp8BlockSize, nr = std::min<int64_t>(kFp8BlockSize, rows - r0);
        band.resize(size_t(nr * k));
        p.to_f32(r0 * k, nr * k, band.data());
        for (int64_t c0 = 0; c0 < k; c0 += kFp8BlockSize) {
          const int64_t c1 = std::min(k, c0 + kFp8BlockSize);
          float max_abs = 0.0f;
          for (int64_t r = 0; r < nr; ++r)
            for (int64_t c = c0; c < c1; ++c) max_abs = std::max(max_abs, std::fabs(band[size_t(r * k + c)]));
          const float scale = fp8_block_scale(max_abs);
          scales[size_t((first_scale_row + blk_row) * kb_pad + c0 / kFp8BlockSize)] = scale;
          if (scale == 0.0f) continue;  // codes stay 0
          for (int64_t r = 0; r < nr; ++r) {
            uint8_t* dst = codes.data() + (first_row + r0 + r) * k_pad;
            for (int64_t c = c0; c < c1; ++c) dst[c] = e4m3_from_f32(band[size_t(r * k + c)] / scale);
          }
        }
      }
    });
  }
  Tensor t(nullptr, DType::FP8_E4M3, {n, k}, Device::CUDA);
  t.data = buffers_->allocate(codes.size(), "weights (fp8 codes)", stream_, cuda::BufferKind::Weights);
  copy_to_device(t.data, codes.data(), codes.size());
  void* s =
      buffers_->allocate(scales.size() * sizeof(float), "weights (fp8 scales)", stream_, cuda::BufferKind::Weights);
  copy_to_device(s, scales.data(), scales.size() * sizeof(float));
  w->scales = w->blas_scales = static_cast<const float*>(s);

  // cuBLASLt's block-scaled matmul (prefill), made at the first FP8 weight: it checks at start-up
  // which scale layout it takes; where that is a transposed one, the weight gets that copy too.
  if (!blas_fp8_) blas_fp8_ = std::make_unique<cuda::CublasFp8>(*buffers_, stream_);
  if (const int64_t ld = blas_fp8_->enabled() ? blas_fp8_->weight_scale_ld(scale_rows) : 0; ld > 0) {
    std::vector<float> scales_t(size_t(kb_pad * ld), 0.0f);
    for (int64_t r = 0; r < scale_rows; ++r)
      for (int64_t c = 0; c < kb_pad; ++c) scales_t[size_t(c * ld + r)] = scales[size_t(r * kb_pad + c)];
    void* st =
        buffers_->allocate(scales_t.size() * sizeof(float), "weights (fp8 scales)", stream_, cuda::BufferKind::Weights);
    copy_to_device(st, scales_t.data(), scales_t.size() * sizeof(float));
    w->blas_scales = static_cast<const float*>(st);
  }

  // The prefill path's quantized activations: [max_step_tokens, k_pad] codes and their scales
  // (max_step_tokens rounded up to 4 rows per 128-column block); once per model (the widest k_pad).
  // Sized for gpt-oss's widest input (o_proj's 4,096) at once, so the workspace is allocated once.
  if (w->k_pad > fp8_act_k_pad_) {
    const int k_pad_planned = std::max(w->k_pad, kPlannedFp8KPad);
    const size_t tokens = size_t(options_.max_step_tokens + 3) / 4 * 4;
    fp8_act_codes_ = device_alloc(tokens * size_t(k_pad_planned), "FP8 activation codes workspace");
    fp8_act_scales_ = static_cast<float*>(device_alloc(tokens * size_t(k_pad_planned / cuda::kFp8Block) * sizeof(float),
                                                       "FP8 activation scales workspace"));
    fp8_act_k_pad_ = k_pad_planned;
  }
  cuda::fp8_gemv_prepare(w->k_pad);
  fp8_weights_.emplace(t.data, std::move(w));
  return t;
}

Tensor CudaBackend::upload_unembedding(std::span<const HostTensor* const> parts) {
  Tensor w = upload_linear(parts);
  if (!greedy_screen_enabled_) return w;
  // The unscreened one-row unembedding must be bf16_gemv<1, 1>, whose logits the rescore repeats bit for bit.
  const bool fits = w.dtype == DType::BF16 && w.ndim == 2 && cuda::greedy_screen_supported(w.dim(0), int(w.dim(1))) &&
                    cuda::gemv_one_warp_per_row(int(w.dim(0)), num_sms_) && gemv_max_rows_ >= 1;
  if (!fits) {
    // Expected for FP8 unembeddings (mxfp4-fp8, fp8), whose codes are already a byte an element.
    spdlog::info(
        "cuda: no greedy screen for the unembedding ({} {}): the screen takes bf16 on a one-warp-a-row "
        "GEMV with k a multiple of 16 up to {}; greedy steps run the full GEMV",
        dtype_name(w.dtype), w.shape_str(), cuda::kGreedyScreenMaxK);
    return w;
  }
  bind_device();
  const int64_t n = w.dim(0);
  const int k = int(w.dim(1));
  auto screen = std::make_unique<GreedyScreen>();
  screen->lm_head = w.data;
  cuda::GreedyScreenWeights& g = screen->weights;
  g.w = static_cast<const uint16_t*>(w.data);
  g.n = n;
  g.k = k;
  g.codes = static_cast<int8_t*>(
      buffers_->allocate(size_t(n) * size_t(k), "greedy screen codes", stream_, cuda::BufferKind::Weights));
  auto* per_row = static_cast<float*>(buffers_->allocate(4 * size_t(n) * sizeof(float), "greedy screen row numbers",
                                                         stream_, cuda::BufferKind::Weights));
  g.scale = per_row;
  g.norm_w = per_row + n;
  g.norm_w_hat = per_row + 2 * n;
  g.norm_err = per_row + 3 * n;
  cuda::GreedyScreenState& st = screen->state;
  st.upper = static_cast<float*>(device_alloc(size_t(n) * sizeof(float), "greedy screen bounds"));
  st.words =
      static_cast<uint32_t*>(device_alloc(cuda::kGreedyScreenWords * sizeof(uint32_t), "greedy screen counters"));
  st.candidates = static_cast<int32_t*>(
      device_alloc(size_t(cuda::kGreedyScreenMaxCandidates) * sizeof(int32_t), "greedy screen candidates"));
  OSSRT_CUDA_CHECK(cudaMemsetAsync(st.words, 0, cuda::kGreedyScreenWords * sizeof(uint32_t), stream_));
  cuda::launch_greedy_screen_prepare(g, stream_);
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  greedy_screens_[w.data] = std::move(screen);
  spdlog::info("cuda: greedy screen of the unembedding [{}, {}]: {:.1f} MiB of int8 codes", n, k,
               double(cuda::greedy_screen_weight_bytes(n, k)) / 1048576.0);
  return w;
}

namespace {

// Every host -> device copy of the weight upload goes through the backend's stream and is complete
// on return. Plain cudaMemcpy runs on the legacy default stream, which does NOT order with the
// backend's cudaStreamNonBlocking stream, and for pageable sources it may return before the DMA
// lands: the dequant kernel (on the backend's stream) then read a half-filled staging buffer, and
// small models (whose whole copy fits in the driver's in-flight staging) got garbage experts.
void copy_host_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  OSSRT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// Uploads a checkpoint's MXFP4 experts in chunks of experts through a device staging buffer (blocks,
// then scales) and hands each chunk to `use(d_blocks, d_scales, first_expert, count)` on `stream`.
// Chunks hold up to kDequantStagingBytes of blocks, and at most max_chunk experts where given (a user
// whose own staging is larger per expert).
template <typename Use>
void stage_mxfp4_chunks(const HostExperts& x, cudaStream_t stream, Use use, int64_t max_chunk = 0) {
  const int64_t e_count = x.experts, out = x.out, in = x.in;
  OSSRT_CHECK(in % kMxfp4BlockElems == 0, "experts {}: in {} is not a multiple of 32", x.blocks.name, in);
  OSSRT_CHECK(x.blocks.data && x.scales.data, "experts {}: missing blocks or scales", x.blocks.name);
  const size_t block_bytes_per_expert = size_t(out) * size_t(in / 2);
  const size_t scale_bytes_per_expert = size_t(out) * size_t(in / kMxfp4BlockElems);
  int64_t chunk = std::max<int64_t>(1, int64_t(kDequantStagingBytes / block_bytes_per_expert));
  if (max_chunk > 0) chunk = std::min(chunk, max_chunk);
  uint8_t* staging = nullptr;
  const size_t staging_bytes = size_t(std::min(chunk, e_count)) * (block_bytes_per_expert + scale_bytes_per_expert);
  // A load-time temporary, freed below: not part of the steady-state memory plan.
  OSSRT_CUDA_CHECK(cudaMalloc(&staging, staging_bytes));
  for (int64_t e0 = 0; e0 < e_count; e0 += chunk) {
    const int64_t n = std::min(chunk, e_count - e0);
    uint8_t* d_blocks = staging;
    uint8_t* d_scales = staging + size_t(n) * block_bytes_per_expert;
    copy_host_to_device(d_blocks, static_cast<const uint8_t*>(x.blocks.data) + size_t(e0) * block_bytes_per_expert,
                        size_t(n) * block_bytes_per_expert, stream);
    copy_host_to_device(d_scales, static_cast<const uint8_t*>(x.scales.data) + size_t(e0) * scale_bytes_per_expert,
                        size_t(n) * scale_bytes_per_expert, stream);
    use(d_blocks, d_scales, e0, n);
    OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  OSSRT_CUDA_CHECK(cudaFree(staging));
}

// Repacks one MXFP4 expert projection [E, out, in] into the MoE kernels' layout (kernels/moe_mxfp4.cuh)
// at q / q_scales, never through bf16. gate_up_pairs: the gate/up row pairing of the first GEMM.
void upload_mxfp4_matrix(const HostExperts& x, bool gate_up_pairs, uint8_t* q, uint8_t* q_scales, cudaStream_t stream) {
  OSSRT_CHECK(x.out % cuda::kMxRowTile == 0 && x.in % cuda::kMxColChunk == 0,
              "experts {}: [{}, {}] does not fit the MXFP4 kernels (rows a multiple of {}, columns of {})",
              x.blocks.name, x.out, x.in, cuda::kMxRowTile, cuda::kMxColChunk);
  uint32_t* max_scale = nullptr;
  OSSRT_CUDA_CHECK(cudaMalloc(&max_scale, sizeof(uint32_t)));
  OSSRT_CUDA_CHECK(cudaMemsetAsync(max_scale, 0, sizeof(uint32_t), stream));
  stage_mxfp4_chunks(x, stream, [&](const uint8_t* blocks, const uint8_t* scales, int64_t e0, int64_t n) {
    cuda::Mxfp4RepackArgs a;
    a.blocks = blocks;
    a.scales = scales;
    a.q = q + cuda::mxfp4_values_bytes(e0, x.out, x.in);
    a.q_scales = q_scales + cuda::mxfp4_scales_bytes(e0, x.out, x.in);
    a.experts = int(n);
    a.rows = int(x.out);
    a.cols = int(x.in);
    a.gate_up_pairs = gate_up_pairs;
    a.max_scale = max_scale;
    cuda::launch_mxfp4_repack(a, stream);
  });
  uint32_t seen = 0;
  OSSRT_CUDA_CHECK(cudaMemcpyAsync(&seen, max_scale, sizeof(seen), cudaMemcpyDeviceToHost, stream));
  OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream));
  OSSRT_CUDA_CHECK(cudaFree(max_scale));
  OSSRT_CHECK(seen <= uint32_t(cuda::kMxMaxScale),
              "experts {}: an MXFP4 scale byte of {} (2^{}) exceeds the {} the resident-MXFP4 kernels take (weights "
              "beyond +-12); load with --quantization bf16",
              x.blocks.name, seen, int(seen) - 127, cuda::kMxMaxScale);
}

// Expands one expert projection into bf16 [E, out, in] at dst.
void upload_expert_matrix(const HostExperts& x, uint16_t* dst, cudaStream_t stream) {
  const int64_t e_count = x.experts, out = x.out, in = x.in;
  switch (x.format) {
    case HostExperts::Format::Mxfp4: {
      stage_mxfp4_chunks(x, stream, [&](const uint8_t* blocks, const uint8_t* scales, int64_t e0, int64_t n) {
        cuda::Mxfp4DequantArgs args{blocks, scales, dst + size_t(e0) * size_t(out) * size_t(in), n * out, in};
        OSSRT_CUDA_CHECK(cuda::launch_mxfp4_to_bf16_dequant(args, stream));
      });
      return;
    }
    case HostExperts::Format::Dense:
      if (x.weight.dtype == DType::BF16) {
        copy_host_to_device(dst, x.weight.data, size_t(e_count * out * in) * 2, stream);
        return;
      }
      [[fallthrough]];
    case HostExperts::Format::DenseTransposed: {
      // Per expert through HostExperts::row_f32 (exact), rounded to bf16.
      std::vector<float> row(static_cast<size_t>(in));
      std::vector<uint16_t> host(static_cast<size_t>(out * in));
      for (int64_t e = 0; e < e_count; ++e) {
        for (int64_t r = 0; r < out; ++r) {
          x.row_f32(e, r, row.data());
          for (int64_t i = 0; i < in; ++i) host[size_t(r * in + i)] = f32_to_bf16(row[size_t(i)]);
        }
        copy_host_to_device(dst + size_t(e) * size_t(out * in), host.data(), host.size() * 2, stream);
      }
      return;
    }
  }
}

// Quantizes one expert projection [E, out, in] to the FP8 experts' layout (kernels/moe_fp8.cuh) at
// codes / scales, in chunks of experts through device staging: MXFP4 sources dequantized to bf16 on
// the device (exact: an MXFP4 value is a bf16 value), dense ones as bf16 rows (the backend's rule for
// every weight: bf16 checkpoints exactly, f32 / f16 ones rounded), then block-quantized by the scheme
// (core/fp8.h's rule, bit for bit) and packed. Never a full bf16 copy: the 120b's experts are 115 GB
// of codes. gate_up_pairs: the gate/up row pairing of the first GEMM.
void upload_fp8_expert_matrix(const HostExperts& x, bool gate_up_pairs, uint8_t* codes, float* scales,
                              cudaStream_t stream) {
  OSSRT_CHECK(x.out % cuda::kFp8ExpertTileRows == 0,
              "experts {}: {} rows do not fit the FP8 expert kernels (a multiple of {})",
              x.format == HostExperts::Format::Mxfp4 ? x.blocks.name : x.weight.name, x.out, cuda::kFp8ExpertTileRows);
  const size_t bf16_per_expert = size_t(x.out) * size_t(x.in) * 2;
  const size_t codes_per_expert = cuda::fp8_expert_code_bytes(1, x.out, x.in);
  const size_t scales_per_expert = cuda::fp8_expert_scale_count(1, x.out, x.in);
  // Experts a chunk: kDequantStagingBytes of bf16 values (the 120b's gate_up: 8), their codes beside.
  const int64_t chunk = std::max<int64_t>(1, int64_t(kDequantStagingBytes / bf16_per_expert));
  uint16_t* bf16 = nullptr;
  uint8_t* plain = nullptr;
  int64_t staged = 0;  // experts the staging holds
  auto quantize_chunk = [&](int64_t e0, int64_t n) {
    cuda::Fp8BlockQuantizeArgs q;
    q.w = bf16;
    q.codes = plain;
    q.scales = scales + size_t(e0) * scales_per_expert;
    q.experts = int(n);
    q.rows = int(x.out);
    q.cols = int(x.in);
    cuda::launch_fp8_quantize_expert_blocks(q, stream);
    cuda::Fp8ExpertPackArgs pk;
    pk.codes = plain;
    pk.out = codes + size_t(e0) * codes_per_expert;
    pk.experts = int(n);
    pk.rows = int(x.out);
    pk.cols = int(x.in);
    pk.gate_up_pairs = gate_up_pairs;
    cuda::launch_fp8_expert_pack(pk, stream);
    OSSRT_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  // Load-time temporaries, freed below: not part of the steady-state memory plan.
  auto stage = [&](int64_t n) {
    if (n <= staged) return;
    if (bf16) OSSRT_CUDA_CHECK(cudaFree(bf16));
    if (plain) OSSRT_CUDA_CHECK(cudaFree(plain));
    OSSRT_CUDA_CHECK(cudaMalloc(&bf16, size_t(n) * bf16_per_expert));
    OSSRT_CUDA_CHECK(cudaMalloc(&plain, size_t(n) * codes_per_expert));
    staged = n;
  };
  if (x.format == HostExperts::Format::Mxfp4) {
    stage_mxfp4_chunks(
        x, stream,
        [&](const uint8_t* blocks, const uint8_t* sc, int64_t e0, int64_t n) {
          stage(n);
          cuda::Mxfp4DequantArgs args{blocks, sc, bf16, n * x.out, x.in};
          OSSRT_CUDA_CHECK(cuda::launch_mxfp4_to_bf16_dequant(args, stream));
          quantize_chunk(e0, n);
        },
        chunk);
  } else {
    std::vector<float> row(static_cast<size_t>(x.in));
    std::vector<uint16_t> host;
    for (int64_t e0 = 0; e0 < x.experts; e0 += chunk) {
      const int64_t n = std::min(chunk, x.experts - e0);
      stage(n);
      host.resize(size_t(n * x.out * x.in));
      for (int64_t e = 0; e < n; ++e)
        for (int64_t r = 0; r < x.out; ++r) {
          x.row_f32(e0 + e, r, row.data());
          uint16_t* dst = host.data() + size_t((e * x.out + r) * x.in);
          for (int64_t i = 0; i < x.in; ++i) dst[i] = f32_to_bf16(row[size_t(i)]);
        }
      copy_host_to_device(bf16, host.data(), host.size() * 2, stream);
      quantize_chunk(e0, n);
    }
  }
  if (bf16) OSSRT_CUDA_CHECK(cudaFree(bf16));
  if (plain) OSSRT_CUDA_CHECK(cudaFree(plain));
}

}  // namespace

ExpertWeights CudaBackend::upload_experts(const HostExperts& gate_up, const HostExperts& down) {
  return upload_experts_as(gate_up, down, options_.weight_format);
}

ExpertWeights CudaBackend::upload_experts_as(const HostExperts& gate_up, const HostExperts& down, WeightFormat format) {
  bind_device();
  OSSRT_CHECK(gate_up.experts == down.experts && gate_up.out == 2 * down.in && gate_up.in == down.out,
              "upload_experts: gate_up [{}, {}, {}] and down [{}, {}, {}] do not fit together", gate_up.experts,
              gate_up.out, gate_up.in, down.experts, down.out, down.in);
  OSSRT_CHECK(gate_up.experts <= cuda::kMoeMaxExperts, "upload_experts: {} experts > {}", gate_up.experts,
              cuda::kMoeMaxExperts);
  ExpertWeights w;
  w.experts = gate_up.experts;
  w.hidden = gate_up.in;
  w.intermediate = down.in;
  const bool mxfp4 = format == WeightFormat::Mxfp4 || format == WeightFormat::Mxfp4Fp8;
  if (mxfp4)
    OSSRT_CHECK(gate_up.format == HostExperts::Format::Mxfp4 && down.format == HostExperts::Format::Mxfp4,
                "the MXFP4 weight format keeps the experts as the checkpoint stores them, but the experts of {} are "
                "not MXFP4 (a bf16 checkpoint?): load it with --quantization bf16",
                gate_up.format == HostExperts::Format::Mxfp4 ? down.weight.name : gate_up.weight.name);
  // MXFP4: values U8 [E, out, in / 2] and scales U8 [E, out, in / 32], both in the kernels' layout.
  auto upload_mxfp4 = [&](const HostExperts& x, bool gate_up_pairs, const char* what, Tensor& scales) {
    Tensor t(nullptr, DType::U8, {x.experts, x.out, x.in / 2}, Device::CUDA);
    t.data = buffers_->allocate(t.bytes(), what, stream_, cuda::BufferKind::Weights);
    scales = Tensor(nullptr, DType::U8, {x.experts, x.out, x.in / kMxfp4BlockElems}, Device::CUDA);
    scales.data = buffers_->allocate(scales.bytes(), what, stream_, cuda::BufferKind::Weights);
    upload_mxfp4_matrix(x, gate_up_pairs, static_cast<uint8_t*>(t.data), static_cast<uint8_t*>(scales.data), stream_);
    return t;
  };
  auto upload_matrix = [&](const HostExperts& x, const char* what) {
    Tensor t(nullptr, DType::BF16, {x.experts, x.out, x.in}, Device::CUDA);
    t.data = buffers_->allocate(t.bytes(), what, stream_, cuda::BufferKind::Weights);
    upload_expert_matrix(x, static_cast<uint16_t*>(t.data), stream_);
    return t;
  };
  auto upload_bias = [&](const HostExperts& x, const char* what) {
    check_float_dtype(x.bias);
    OSSRT_CHECK(x.bias.numel() == x.experts * x.out, "expert bias {} has {} elements, expected {}", x.bias.name,
                x.bias.numel(), x.experts * x.out);
    std::vector<float> host(static_cast<size_t>(x.bias.numel()));
    x.bias.to_f32(0, x.bias.numel(), host.data());
    Tensor t(nullptr, DType::F32, {x.experts, x.out}, Device::CUDA);
    t.data = buffers_->allocate(t.bytes(), what, stream_, cuda::BufferKind::Weights);
    copy_to_device(t.data, host.data(), t.bytes());
    return t;
  };
  // FP8: codes FP8_E4M3 [E, out, fp8_expert_k_pad(in)] in the kernels' layout and scales F32 [E,
  // ceil(out / 128), ceil(in / 128)] (ExpertWeights' Fp8 shape).
  auto upload_fp8 = [&](const HostExperts& x, bool gate_up_pairs, const char* what, Tensor& scales) {
    Tensor t(nullptr, DType::FP8_E4M3, {x.experts, x.out, cuda::fp8_expert_k_pad(x.in)}, Device::CUDA);
    t.data = buffers_->allocate(t.bytes(), what, stream_, cuda::BufferKind::Weights);
    scales = Tensor(nullptr, DType::F32, {x.experts, cuda::fp8_expert_blocks(x.out), cuda::fp8_expert_blocks(x.in)},
                    Device::CUDA);
    scales.data = buffers_->allocate(scales.bytes(), what, stream_, cuda::BufferKind::Weights);
    upload_fp8_expert_matrix(x, gate_up_pairs, static_cast<uint8_t*>(t.data), scales.ptr<float>(), stream_);
    return t;
  };
  const bool fp8 = format == WeightFormat::Fp8;
  if (mxfp4) {
    w.gate_up_w = upload_mxfp4(gate_up, true, "expert weights (gate_up, mxfp4)", w.gate_up_scales);
    w.down_w = upload_mxfp4(down, false, "expert weights (down, mxfp4)", w.down_scales);
  } else if (fp8) {
    w.gate_up_w = upload_fp8(gate_up, true, "expert weights (gate_up, fp8)", w.gate_up_scales);
    w.down_w = upload_fp8(down, false, "expert weights (down, fp8)", w.down_scales);
  } else {
    w.gate_up_w = upload_matrix(gate_up, "expert weights (gate_up)");
    w.down_w = upload_matrix(down, "expert weights (down)");
  }
  w.gate_up_b = upload_bias(gate_up, "expert biases (gate_up)");
  w.down_b = upload_bias(down, "expert biases (down)");

  const size_t need = fp8 ? cuda::moe_fp8_workspace_bytes(options_.max_step_tokens, kPlannedTopK, int(w.experts),
                                                          int(w.hidden), int(w.intermediate))
                          : cuda::moe_workspace_bytes(options_.max_step_tokens, kPlannedTopK, int(w.experts),
                                                      int(w.hidden), int(w.intermediate));
  if (need > moe_workspace_bytes_) {
    // Every layer has the same shape, so this allocates once per model.
    moe_workspace_ = device_alloc(need, "MoE workspace");
    moe_workspace_bytes_ = need;
  }
  return w;
}

}  // namespace ossrt
