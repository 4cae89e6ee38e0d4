#pragma once
// Host-side views of a gpt-oss checkpoint, as the loader produces them: pointers into memory-mapped
// safetensors files (or into owned buffers for dummy weights), in the checkpoint's own dtypes.
// Backends convert these to their formats in Backend::upload*; nothing here copies whole files.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace ossrt {

struct HostTensor {
  const void* data = nullptr;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  std::string name;  // checkpoint tensor name, for error messages

  int64_t numel() const;
  bool empty() const { return data == nullptr; }
  // Element i converted to float (bf16, f16, f32 only).
  float at(int64_t i) const;
  // Elements [begin, begin + n) converted to float.
  void to_f32(int64_t begin, int64_t n, float* dst) const;
};

// One expert projection for all experts, logically W[e] of shape [out, in] (PyTorch Linear), plus
// bias [E, out]. Three storage formats occur in checkpoints:
//   Mxfp4           : blocks U8 [E, out, in/32, 16] + scales U8 [E, out, in/32] (official checkpoint)
//   Dense           : [E, out, in] (bf16/f16/f32)
//   DenseTransposed : [E, in, out] (what HF's dequantized GptOssExperts save_pretrained writes)
struct HostExperts {
  enum class Format : uint8_t { Mxfp4, Dense, DenseTransposed };
  Format format = Format::Dense;
  int64_t experts = 0, out = 0, in = 0;
  HostTensor weight;          // Dense / DenseTransposed
  HostTensor blocks, scales;  // Mxfp4
  HostTensor bias;            // [E, out]

  // Dequantizes logical row r (length `in`) of expert e into dst, exactly (fp4 x 2^k is exact in f32).
  void row_f32(int64_t e, int64_t r, float* dst) const;
};

struct HostLayerWeights {
  HostTensor attn_norm;       // [H]
  HostTensor q_w, q_b;        // [Hq*D, H], [Hq*D]
  HostTensor k_w, k_b;        // [Hkv*D, H], [Hkv*D]
  HostTensor v_w, v_b;        // [Hkv*D, H], [Hkv*D]
  HostTensor o_w, o_b;        // [H, Hq*D], [H]
  HostTensor sinks;           // [Hq]
  HostTensor mlp_norm;        // [H]
  HostTensor router_w, router_b;  // [E, H], [E]
  HostExperts gate_up;        // out = 2*I, rows interleaved: 2j = gate j, 2j+1 = up j
  HostExperts down;           // out = H, in = I
};

struct HostModelWeights {
  GptOssConfig config;
  HostTensor embed;       // [V, H]
  HostTensor final_norm;  // [H]
  HostTensor lm_head;     // [V, H]
  std::vector<HostLayerWeights> layers;
  // Keeps the memory the views point into alive (mapped files, dummy buffers).
  std::vector<std::shared_ptr<void>> keep_alive;
};

}  // namespace ossrt
