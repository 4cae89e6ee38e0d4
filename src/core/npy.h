#pragma once
// NumPy .npy files (format version 1.0/2.0, little-endian, C order): float32 and int32 arrays.
// The logits command writes them; tests read HF's golden logits with them.
#include <cstdint>
#include <string>
#include <vector>

namespace ossrt {

struct NpyArray {
  std::vector<int64_t> shape;
  std::string descr;         // "<f4" or "<i4"
  std::vector<float> f32;    // filled when descr == "<f4"
  std::vector<int32_t> i32;  // filled when descr == "<i4"
};

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
NpyArray read_npy(const std::string& path);  // throws ossrt::Error on malformed files

}  // namespace ossrt
