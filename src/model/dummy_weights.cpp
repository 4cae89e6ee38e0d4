// Dummy weights: owned buffers in checkpoint dtypes (bf16 everywhere, MXFP4 experts when the
// widths allow), filled in parallel. The 20b model is ~13 GB, so generation is a flat list of
// 1M-element chunks spread over a thread pool, each chunk seeded from (seed, tensor, chunk).
#include "model/dummy_weights.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/threads.h"

namespace ossrt {
namespace {

constexpr int64_t kChunkElems = int64_t(1) << 20;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Approximately N(0, 1) from one 64-bit draw: the sum of four 16-bit uniforms (Irwin-Hall), which
// is smooth enough for weights and much cheaper than Box-Muller.
inline float approx_normal(uint64_t r) {
  float s = 0;
  for (int i = 0; i < 4; ++i) s += float((r >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
  return (s - 2.0f) * 1.7320508f;  // variance of the sum is 4/12
}

enum class FillKind : uint8_t { Normal, RandomBytes, Mxfp4Scales };

struct TensorFill {
  uint8_t* dst;
  int64_t n;  // elements (bytes for RandomBytes / Mxfp4Scales)
  FillKind kind;
  float mean = 0, stddev = 0;  // Normal
  int scale_exponent = 0;      // Mxfp4Scales: centre of the E8M0 exponents
  uint64_t stream = 0;         // tensor index, separates RNG streams
};

void fill_chunk(const TensorFill& f, int64_t chunk, uint64_t seed) {
  uint64_t state = seed * 0x2545f4914f6cdd1dull ^ (f.stream << 32) ^ uint64_t(chunk) * 0x9e3779b97f4a7c15ull;
  splitmix64(state);
  const int64_t begin = chunk * kChunkElems;
  const int64_t end = std::min(f.n, begin + kChunkElems);
  switch (f.kind) {
    case FillKind::Normal: {
      auto* out = reinterpret_cast<uint16_t*>(f.dst);
      for (int64_t i = begin; i < end; ++i) out[i] = f32_to_bf16(f.mean + f.stddev * approx_normal(splitmix64(state)));
      break;
    }
    case FillKind::RandomBytes: {
      // Uniform fp4 codes: every nibble value, both signs, equally likely.
      for (int64_t i = begin; i < end; i += 8) {
        uint64_t r = splitmix64(state);
        for (int64_t k = i; k < std::min(end, i + 8); ++k, r >>= 8) f.dst[k] = uint8_t(r);
      }
      break;
    }
    case FillKind::Mxfp4Scales: {
      for (int64_t i = begin; i < end; ++i) {
        const int jitter = int(splitmix64(state) % 3) - 1;  // exponent centre -1, 0 or +1
        f.dst[i] = uint8_t(127 + f.scale_exponent + jitter);
      }
      break;
    }
  }
}

class DummyBuilder {
 public:
  explicit DummyBuilder(HostModelWeights& w) : w_(w) {}

  HostTensor normal(std::string name, std::vector<int64_t> shape, float mean, float stddev) {
    HostTensor t = alloc(std::move(name), std::move(shape), DType::BF16);
    fills_.push_back({const_cast<uint8_t*>(static_cast<const uint8_t*>(t.data)), t.numel(), FillKind::Normal, mean,
                      stddev, 0, fills_.size()});
    return t;
  }
  // Weight matrix [.., in] scaled so that y = W x keeps x's magnitude.
  HostTensor matrix(std::string name, std::vector<int64_t> shape, int64_t in) {
    return normal(std::move(name), std::move(shape), 0.0f, 1.0f / std::sqrt(float(in)));
  }
  HostTensor bytes(std::string name, std::vector<int64_t> shape, FillKind kind, int scale_exponent = 0) {
    HostTensor t = alloc(std::move(name), std::move(shape), DType::U8);
    fills_.push_back({const_cast<uint8_t*>(static_cast<const uint8_t*>(t.data)), t.numel(), kind, 0, 0, scale_exponent,
                      fills_.size()});
    return t;
  }

  void run(uint64_t seed, int threads) {
    struct Chunk {
      uint32_t fill;
      int64_t index;
    };
    std::vector<Chunk> chunks;
    for (size_t f = 0; f < fills_.size(); ++f)
      for (int64_t c = 0; c * kChunkElems < fills_[f].n; ++c) chunks.push_back({uint32_t(f), c});
    ThreadPool pool(threads);
    pool.parallel_for(int64_t(chunks.size()), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) fill_chunk(fills_[chunks[i].fill], chunks[i].index, seed);
    });
  }

 private:
  HostTensor alloc(std::string name, std::vector<int64_t> shape, DType dtype) {
    HostTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.dtype = dtype;
    // new[] without () leaves the bytes uninitialized: the fill threads touch each page first, so
    // zeroing 13 GB on one thread is avoided.
    std::shared_ptr<uint8_t[]> buf(new uint8_t[size_t(t.numel()) * dtype_size(dtype)]);
    t.data = buf.get();
    w_.keep_alive.push_back(std::shared_ptr<void>(buf, buf.get()));
    return t;
  }
  HostModelWeights& w_;
  std::vector<TensorFill> fills_;
};

HostExperts dummy_experts(DummyBuilder& b, const std::string& prefix, int64_t E, int64_t out, int64_t in, bool mxfp4) {
  HostExperts x;
  x.experts = E, x.out = out, x.in = in;
  if (mxfp4) {
    x.format = HostExperts::Format::Mxfp4;
    // Uniform E2M1 codes have an RMS of ~2.93; pick the E8M0 exponent that brings the element RMS
    // to ~1/sqrt(in), the same magnitude as the dense matrices.
    const int exponent = int(std::lround(std::log2(1.0 / (std::sqrt(double(in)) * 2.93))));
    x.blocks = b.bytes(prefix + "_blocks", {E, out, in / kMxfp4BlockElems, kMxfp4BlockBytes}, FillKind::RandomBytes);
    x.scales = b.bytes(prefix + "_scales", {E, out, in / kMxfp4BlockElems}, FillKind::Mxfp4Scales, exponent);
  } else {
    x.format = HostExperts::Format::DenseTransposed;  // HF's layout [E, in, out]
    x.weight = b.matrix(prefix, {E, in, out}, in);
  }
  x.bias = b.normal(prefix + "_bias", {E, out}, 0.0f, 0.02f);
  return x;
}

}  // namespace

HostModelWeights make_dummy_weights_threaded(const GptOssConfig& config, uint64_t seed, int threads) {
  config.validate();
  HostModelWeights w;
  w.config = config;
  const int64_t H = config.hidden_size, I = config.intermediate_size, E = config.num_experts;
  const int64_t V = config.vocab_size, q = config.q_dim(), kv = config.kv_dim();
  const bool mxfp4 = H % kMxfp4BlockElems == 0 && I % kMxfp4BlockElems == 0;
  w.config.experts_mxfp4 = mxfp4;
  DummyBuilder b(w);
  w.embed = b.normal("model.embed_tokens.weight", {V, H}, 0.0f, 1.0f);
  w.final_norm = b.normal("model.norm.weight", {H}, 1.0f, 0.05f);
  w.lm_head = b.matrix("lm_head.weight", {V, H}, H);
  for (int l = 0; l < config.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    HostLayerWeights lw;
    lw.attn_norm = b.normal(p + "input_layernorm.weight", {H}, 1.0f, 0.05f);
    lw.q_w = b.matrix(p + "self_attn.q_proj.weight", {q, H}, H);
    lw.q_b = b.normal(p + "self_attn.q_proj.bias", {q}, 0.0f, 0.02f);
    lw.k_w = b.matrix(p + "self_attn.k_proj.weight", {kv, H}, H);
    lw.k_b = b.normal(p + "self_attn.k_proj.bias", {kv}, 0.0f, 0.02f);
    lw.v_w = b.matrix(p + "self_attn.v_proj.weight", {kv, H}, H);
    lw.v_b = b.normal(p + "self_attn.v_proj.bias", {kv}, 0.0f, 0.02f);
    lw.o_w = b.matrix(p + "self_attn.o_proj.weight", {H, q}, q);
    lw.o_b = b.normal(p + "self_attn.o_proj.bias", {H}, 0.0f, 0.02f);
    lw.sinks = b.normal(p + "self_attn.sinks", {config.num_attention_heads}, 0.0f, 1.0f);
    lw.mlp_norm = b.normal(p + "post_attention_layernorm.weight", {H}, 1.0f, 0.05f);
    lw.router_w = b.matrix(p + "mlp.router.weight", {E, H}, H);
    lw.router_b = b.normal(p + "mlp.router.bias", {E}, 0.0f, 0.02f);
    lw.gate_up = dummy_experts(b, p + "mlp.experts.gate_up_proj", E, 2 * I, H, mxfp4);
    lw.down = dummy_experts(b, p + "mlp.experts.down_proj", E, H, I, mxfp4);
    w.layers.push_back(std::move(lw));
  }
  b.run(seed, threads);
  return w;
}

}  // namespace ossrt
