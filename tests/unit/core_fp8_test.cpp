// core/fp8.h: e4m3 conversions against a brute-force reference (the nearest of the 126 positive finite
// values, written here from the OCP table), every code, the rounding boundaries, subnormals, NaN and
// saturation; the 128x128 block rule against a naive per-element implementation on odd shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "fp8_reference.h"

namespace ossrt {
namespace {

using testing::E4m3Entry;
using testing::naive_block_quantize;
using testing::positive_table;
using testing::reference_from_f32;

TEST(E4m3, EveryCodeRoundTrips) {
  const std::vector<E4m3Entry> table = positive_table();
  ASSERT_EQ(table.size(), 127u);
  EXPECT_EQ(table.back().value, 448.0);
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = uint8_t(c);
    const float v = e4m3_to_f32(code);
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      EXPECT_EQ(e4m3_from_f32(v) & 0x7f, 0x7f) << "NaN stays NaN, code " << c;
      continue;
    }
    const double expected = (code & 0x80 ? -1.0 : 1.0) * table[code & 0x7f].value;
    EXPECT_EQ(double(v), expected) << "code " << c;
    EXPECT_EQ(std::signbit(v), bool(code & 0x80)) << "code " << c;
    EXPECT_EQ(e4m3_from_f32(v), code) << "code " << c << " value " << v;
  }
}

TEST(E4m3, MidpointsTieToEvenAndNeighboursRoundToTheNearer) {
  const std::vector<E4m3Entry> table = positive_table();
  for (size_t i = 0; i + 1 < table.size(); ++i) {
    const float lo = float(table[i].value), hi = float(table[i + 1].value);
    const float mid = float((double(lo) + double(hi)) / 2);  // exact: e4m3 midpoints need 5 bits
    ASSERT_EQ(double(mid), (table[i].value + table[i + 1].value) / 2);
    const uint8_t even = (table[i].code & 1) == 0 ? table[i].code : table[i + 1].code;
    for (float sign : {1.0f, -1.0f}) {
      const uint8_t s = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(e4m3_from_f32(sign * mid), s | even) << "midpoint " << mid;
      EXPECT_EQ(e4m3_from_f32(sign * std::nextafter(mid, 0.0f)), s | table[i].code) << "just below " << mid;
      EXPECT_EQ(e4m3_from_f32(sign * std::nextafter(mid, 1e9f)), s | table[i + 1].code) << "just above " << mid;
    }
  }
}

TEST(E4m3, NamedCases) {
  EXPECT_EQ(e4m3_from_f32(1.0f), 0x38);
  EXPECT_EQ(e4m3_from_f32(1.0625f), 0x38);  // tie between 1 (even) and 1.125
  EXPECT_EQ(e4m3_from_f32(1.1875f), 0x3a);  // tie between 1.125 and 1.25 (even)
  EXPECT_EQ(e4m3_from_f32(-2.0f), 0xc0);
  // Subnormals: 2^-9 is the smallest; half of it ties to zero, anything above half goes up.
  EXPECT_EQ(e4m3_from_f32(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(e4m3_from_f32(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(e4m3_from_f32(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(e4m3_from_f32(3 * std::ldexp(1.0f, -10)), 0x02);    // tie between 1 and 2 (even) * 2^-9
  EXPECT_EQ(e4m3_from_f32(7.5f * std::ldexp(1.0f, -9)), 0x08);  // rounds up into the first normal 2^-6
  EXPECT_EQ(e4m3_from_f32(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(e4m3_from_f32(-std::numeric_limits<float>::denorm_min()), 0x80);
  EXPECT_EQ(e4m3_from_f32(0.0f), 0x00);
  EXPECT_EQ(e4m3_from_f32(-0.0f), 0x80);
  // Saturation: 464 would round to 480 (the NaN code) without it; everything above 448 is 448.
  EXPECT_EQ(e4m3_from_f32(448.0f), 0x7e);
  EXPECT_EQ(e4m3_from_f32(464.0f), 0x7e);
  EXPECT_EQ(e4m3_from_f32(500.0f), 0x7e);
  EXPECT_EQ(e4m3_from_f32(-1e30f), 0xfe);
  EXPECT_EQ(e4m3_from_f32(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(e4m3_from_f32(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(e4m3_from_f32(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(e4m3_from_f32(-std::numeric_limits<float>::quiet_NaN()), 0xff);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(E4m3, RandomFloatsMatchTheBruteForceReference) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = unit(rng) * std::exp2(exponent(rng));
    ASSERT_EQ(e4m3_from_f32(x), reference_from_f32(x)) << "x = " << x;
  }
}

TEST(Fp8Blocks, OddShapesMatchTheNaiveRule) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 7}, {3, 130}, {129, 127}, {200, 257}}) {
    std::vector<float> w(size_t(rows * cols));
    for (float& x : w) x = normal(rng) * 0.05f;
    // One block of zeros (scale 0) and one with a lone large value (most of its values become subnormal).
    if (rows > 128 && cols > 128) {
      for (int64_t r = 128; r < rows; ++r)
        for (int64_t c = 0; c < 128; ++c) w[size_t(r * cols + c)] = 0.0f;
      w[size_t(5 * cols + 200)] = 1000.0f;
    }
    std::vector<float> want_scales;
    const std::vector<float> want = naive_block_quantize(w, rows, cols, &want_scales);
    std::vector<float> got = w, got_scales(want_scales.size(), -2.0f);
    fp8_quantize_blocks_inplace(got.data(), rows, cols, got_scales.data());
    EXPECT_EQ(got_scales, want_scales) << rows << "x" << cols;
    size_t changed = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << rows << "x" << cols << " element " << i;
      changed += got[i] != w[i];
    }
    EXPECT_GT(changed, w.size() / 2) << "quantization must move most values";
  }
}

TEST(Fp8Blocks, ActivationRowsUseGroupsOf128FromChannelZero) {
  std::vector<float> row(300);
  for (size_t i = 0; i < row.size(); ++i) row[i] = std::sin(float(i)) * (i < 128 ? 1.0f : i < 256 ? 100.0f : 0.01f);
  std::vector<float> got = row;
  fp8_quantize_row_inplace(got.data(), int64_t(got.size()));
  const std::vector<float> want = naive_block_quantize(row, 1, 300, nullptr);
  EXPECT_EQ(got, want);
  // Each group's largest magnitude is exactly representable (it maps to 448).
  float m0 = 0.0f;
  for (int i = 0; i < 128; ++i) m0 = std::max(m0, std::fabs(row[size_t(i)]));
  EXPECT_FLOAT_EQ(fp8_quantize_value(m0, fp8_block_scale(m0)), m0);
  EXPECT_EQ(fp8_quantize_value(5.0f, 0.0f), 0.0f);
}

}  // namespace
}  // namespace ossrt
