#pragma once
// Element types ossrt handles, and exact scalar conversions between them.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ossrt {

enum class DType : uint8_t { F32, BF16, F16, FP8_E4M3, U8, I32, I64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::FP8_E4M3: return 1;
    case DType::U8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t);

// bf16 <-> f32. f32 -> bf16 rounds to nearest even (as PyTorch does); NaN stays NaN.
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}
// Rounds an f32 to the nearest bf16 value and back (what a bf16 store then load does).
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);

// MXFP4 (OCP microscaling): E2M1 elements, 32 per block sharing one E8M0 scale.
// Code c in 0..15, bit 3 = sign (docs/reference/SPEC.md section 3.3).
inline constexpr float kFp4E2M1Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline constexpr int kMxfp4BlockElems = 32;
inline constexpr int kMxfp4BlockBytes = 16;
// E8M0 scale with bias 127; the references never special-case 255, and neither do we.
inline float e8m0_to_f32(uint8_t s) { return std::ldexp(1.0f, int(s) - 127); }

}  // namespace ossrt
