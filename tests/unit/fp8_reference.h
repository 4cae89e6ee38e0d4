#pragma once
// An independent statement of the FP8 rule (core/fp8.h) for tests: e4m3 by brute force over the OCP
// table, and the 128x128 block rule written element by element. Shares no code with src/.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace ossrt::testing {

// Every non-negative finite e4m3 value with its code, in increasing order: code c (c < 0x7f) is
// exponent field c >> 3, mantissa c & 7; value = mantissa/8 * 2^-6 for field 0, else
// (1 + mantissa/8) * 2^(field - 7).
struct E4m3Entry {
  double value;
  uint8_t code;
};
inline std::vector<E4m3Entry> positive_table() {
  std::vector<E4m3Entry> t;
  for (int c = 0; c < 0x7f; ++c) {
    const int field = c >> 3, mantissa = c & 7;
    const double v =
        field == 0 ? mantissa / 8.0 * std::pow(2.0, -6) : (1.0 + mantissa / 8.0) * std::pow(2.0, field - 7);
    t.push_back({v, uint8_t(c)});
  }
  return t;
}

// Round to nearest, ties to the even code, saturating at 448; NaN -> 0x7f with the sign.
inline uint8_t reference_from_f32(float x) {
  static const std::vector<E4m3Entry> table = positive_table();
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  const double a = std::fabs(double(x));
  if (a >= 448.0) return sign | 0x7e;
  const E4m3Entry* best = &table[0];
  for (const E4m3Entry& e : table) {
    const double d = std::fabs(e.value - a), db = std::fabs(best->value - a);
    if (d < db || (d == db && (e.code & 1) == 0 && (best->code & 1) == 1)) best = &e;
  }
  return sign | best->code;
}

// The block rule, written plainly: each block's max first, then every element from its block's scale.
inline std::vector<float> naive_block_quantize(const std::vector<float>& w, int64_t rows, int64_t cols,
                                               std::vector<float>* scales) {
  static const std::vector<E4m3Entry> table = positive_table();
  const int64_t block_rows = (rows + 127) / 128, block_cols = (cols + 127) / 128;
  std::vector<float> block_max(size_t(block_rows * block_cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& m = block_max[size_t((r / 128) * block_cols + c / 128)];
      m = std::max(m, std::fabs(w[size_t(r * cols + c)]));
    }
  if (scales) scales->clear();
  for (float m : block_max)
    if (scales) scales->push_back(m / 448.0f);
  std::vector<float> out(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float scale = block_max[size_t((r / 128) * block_cols + c / 128)] / 448.0f;
      const float x = w[size_t(r * cols + c)];
      if (scale == 0.0f) {
        out[size_t(r * cols + c)] = 0.0f;
        continue;
      }
      const uint8_t code = reference_from_f32(x / scale);
      const double v = (code & 0x80 ? -1.0 : 1.0) * table[code & 0x7f].value;
      out[size_t(r * cols + c)] = float(v) * scale;
    }
  return out;
}

}  // namespace ossrt::testing
