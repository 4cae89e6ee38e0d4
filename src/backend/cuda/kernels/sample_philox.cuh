#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a counter-based
// generator, so draw n of a request is a pure function of (seed, n) on any device and on the host.
// Host and device share this code so tests can recompute the exact uniform a GPU draw used.
#include <cstdint>

#if defined(__CUDACC__)
#define OSSRT_HD __host__ __device__ __forceinline__
#else
#define OSSRT_HD inline
#endif

namespace ossrt::cuda {

struct Philox4x32 {
  uint32_t v[4];
};

OSSRT_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * c0;
    const uint64_t p1 = uint64_t(kMul1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits (exact in f32) for draw `offset` of a stream keyed by seed.
OSSRT_HD float philox_uniform(uint32_t seed_lo, uint32_t seed_hi, uint32_t offset) {
  const Philox4x32 r = philox4x32_10(offset, 0u, 0u, 0u, seed_lo, seed_hi);
  return float(r.v[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace ossrt::cuda
