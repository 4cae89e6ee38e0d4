#pragma once
// Host-side views of checkpoint tensors in the checkpoint's own dtypes (bf16, f16, f32, MXFP4 blocks
// and scales): pointers into memory-mapped safetensors files or into owned buffers, never copies of
// whole files. The model's loader produces them (model/host_weights.h groups them per layer) and
// backends convert them to their own formats in Backend::upload*; both sides read them, so they live
// here, below both.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

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

}  // namespace ossrt
