#include "core/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ossrt {

namespace {

constexpr uint8_t kE4m3SignBit = 0x80;
constexpr uint8_t kE4m3Nan = 0x7f;  // S.1111.111; there is no infinity
constexpr int kE4m3MantissaBits = 3;
constexpr int kE4m3Bias = 7;
constexpr int kE4m3MinNormalExponent = 1 - kE4m3Bias;  // 2^-6; below it the step is 2^-9 (subnormals)

// Code of a magnitude that is exactly an e4m3 value in [0, 448].
uint8_t encode_exact_magnitude(float v) {
  if (v == 0.0f) return 0;
  int e = 0;
  std::frexp(v, &e);  // v in [2^(e-1), 2^e)
  const int exponent = e - 1;
  if (exponent < kE4m3MinNormalExponent)  // subnormal: v = m * 2^-9, m in 1..7
    return uint8_t(std::ldexp(v, -(kE4m3MinNormalExponent - kE4m3MantissaBits)));
  const int mantissa = int(std::ldexp(v, kE4m3MantissaBits - exponent)) - (1 << kE4m3MantissaBits);
  return uint8_t(((exponent + kE4m3Bias) << kE4m3MantissaBits) | mantissa);
}

}  // namespace

uint8_t e4m3_from_f32(float x) {
  const uint8_t sign = std::signbit(x) ? kE4m3SignBit : 0;
  if (std::isnan(x)) return sign | kE4m3Nan;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return sign | encode_exact_magnitude(kE4m3Max);  // saturate (infinities too)
  if (a == 0.0f) return sign;
  // The spacing of e4m3 values around a: 2^(exponent - 3) for normals, 2^-9 for subnormals. Scaling
  // by a power of two is exact, so nearbyint (round half to even in the default rounding mode) rounds
  // a itself to the nearest multiple of the spacing; a carry to the next binade stays exact.
  int e = 0;
  std::frexp(a, &e);
  const int spacing_exponent = std::max(e - 1, kE4m3MinNormalExponent) - kE4m3MantissaBits;
  const float rounded = std::ldexp(std::nearbyint(std::ldexp(a, -spacing_exponent)), spacing_exponent);
  return sign | encode_exact_magnitude(std::min(rounded, kE4m3Max));
}

float e4m3_to_f32(uint8_t code) {
  const int exponent_field = (code >> kE4m3MantissaBits) & 0xf;
  const int mantissa = code & ((1 << kE4m3MantissaBits) - 1);
  if ((code & kE4m3Nan) == kE4m3Nan) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent_field == 0 ? std::ldexp(float(mantissa), kE4m3MinNormalExponent - kE4m3MantissaBits)
                                              : std::ldexp(float((1 << kE4m3MantissaBits) + mantissa),
                                                           exponent_field - kE4m3Bias - kE4m3MantissaBits);
  return (code & kE4m3SignBit) ? -magnitude : magnitude;
}

float fp8_quantize_value(float x, float scale) {
  if (scale == 0.0f) return 0.0f;
  return e4m3_to_f32(e4m3_from_f32(x / scale)) * scale;
}

void fp8_quantize_blocks_inplace(float* matrix, int64_t rows, int64_t cols, float* scales) {
  const int64_t block_cols = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  for (int64_t r0 = 0; r0 < rows; r0 += kFp8BlockSize) {
    const int64_t r1 = std::min(rows, r0 + kFp8BlockSize);
    for (int64_t c0 = 0; c0 < cols; c0 += kFp8BlockSize) {
      const int64_t c1 = std::min(cols, c0 + kFp8BlockSize);
      float max_abs = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) max_abs = std::max(max_abs, std::fabs(matrix[r * cols + c]));
      const float scale = fp8_block_scale(max_abs);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) matrix[r * cols + c] = fp8_quantize_value(matrix[r * cols + c], scale);
      if (scales) scales[(r0 / kFp8BlockSize) * block_cols + c0 / kFp8BlockSize] = scale;
    }
  }
}

void fp8_quantize_row_inplace(float* row, int64_t n) { fp8_quantize_blocks_inplace(row, 1, n); }

}  // namespace ossrt
