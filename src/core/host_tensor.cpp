// Element access for host weight views. Checkpoint data sits at whatever byte offset the
// safetensors header chose, so every read goes through memcpy (no aligned-load assumptions).
#include "core/host_tensor.h"

#include <cstring>

#include "core/error.h"

namespace ossrt {
namespace {

inline float load_f32(const uint8_t* base, int64_t i, DType t) {
  switch (t) {
    case DType::F32: {
      float v;
      std::memcpy(&v, base + i * 4, 4);
      return v;
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, base + i * 2, 2);
      return bf16_to_f32(h);
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, base + i * 2, 2);
      return f16_to_f32(h);
    }
    default: return 0.0f;  // callers check the dtype first
  }
}

void require_float(const HostTensor& t) {
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
    fail("tensor {}: dtype {} cannot be read as float", t.name, dtype_name(t.dtype));
  if (t.data == nullptr) fail("tensor {}: no data", t.name.empty() ? "<unnamed>" : t.name);
}

}  // namespace

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float HostTensor::at(int64_t i) const {
  require_float(*this);
  if (i < 0 || i >= numel()) fail("tensor {}: element {} out of range (numel {})", name, i, numel());
  return load_f32(static_cast<const uint8_t*>(data), i, dtype);
}

void HostTensor::to_f32(int64_t begin, int64_t n, float* dst) const {
  require_float(*this);
  if (begin < 0 || n < 0 || begin + n > numel())
    fail("tensor {}: range [{}, {}) out of range (numel {})", name, begin, begin + n, numel());
  const auto* base = static_cast<const uint8_t*>(data);
  switch (dtype) {
    case DType::F32: std::memcpy(dst, base + begin * 4, size_t(n) * 4); break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_f32(base, begin + i, DType::BF16);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_f32(base, begin + i, dtype);
      break;
  }
}

void HostExperts::row_f32(int64_t e, int64_t r, float* dst) const {
  if (e < 0 || e >= experts || r < 0 || r >= out)
    fail("experts {}: row ({}, {}) out of range [{}, {})", format == Format::Mxfp4 ? blocks.name : weight.name, e, r,
         experts, out);
  switch (format) {
    case Format::Mxfp4: {
      // docs/reference/SPEC.md 3.3: 32 elements per block share one E8M0 scale; byte j of a block holds element 2j
      // in its low nibble and 2j+1 in its high nibble. fp4 x 2^k is exact in f32.
      const int64_t blocks_per_row = in / kMxfp4BlockElems;
      const int64_t row = e * out + r;
      const auto* codes = static_cast<const uint8_t*>(blocks.data) + row * blocks_per_row * kMxfp4BlockBytes;
      const auto* row_scales = static_cast<const uint8_t*>(scales.data) + row * blocks_per_row;
      for (int64_t g = 0; g < blocks_per_row; ++g) {
        const float scale = e8m0_to_f32(row_scales[g]);
        const uint8_t* block = codes + g * kMxfp4BlockBytes;
        float* out_block = dst + g * kMxfp4BlockElems;
        for (int j = 0; j < kMxfp4BlockBytes; ++j) {
          out_block[2 * j] = kFp4E2M1Values[block[j] & 0x0F] * scale;
          out_block[2 * j + 1] = kFp4E2M1Values[block[j] >> 4] * scale;
        }
      }
      return;
    }
    case Format::Dense: weight.to_f32((e * out + r) * in, in, dst); return;
    case Format::DenseTransposed: {
      // [E, in, out]: logical row r is column r of expert e's matrix, a strided gather.
      require_float(weight);
      const auto* base = static_cast<const uint8_t*>(weight.data);
      const int64_t expert_base = e * in * out;
      for (int64_t k = 0; k < in; ++k) dst[k] = load_f32(base, expert_base + k * out + r, weight.dtype);
      return;
    }
  }
}

}  // namespace ossrt
