#pragma once
// Reproducible test data by hashing (seed, index) (splitmix64's finalizer), so large host arrays fill
// in parallel chunks and give the same values on any thread count; and the pool that fills them.
#include <cstdint>

#include "core/threads.h"

namespace ossrt::test {

inline ThreadPool& data_pool() {
  static ThreadPool p;
  return p;
}

inline uint64_t mix(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1), 24 random bits.
inline float uniform(uint64_t seed, uint64_t i) { return float(mix(seed, i) >> 40) * (2.0f / 16777216.0f) - 1.0f; }

}  // namespace ossrt::test
