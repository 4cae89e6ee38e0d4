#pragma once
// When each request of a serving benchmark is sent: all at once (`--request-rate inf`), or as a
// Poisson process of the given rate, as `vllm bench serve` does (exponential gaps of mean
// 1 / rate). The gaps come from a seeded 64-bit Mersenne twister through the inverse CDF,
// -ln(1 - u) / rate, rather than std::exponential_distribution, whose algorithm the standard leaves
// to the library: the same --seed gives the same schedule with any compiler.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace ossrt::bench {

// Send times in seconds from the start for n requests: all 0 when rate is infinite, else request 0
// at 0 and request i at the sum of i exponential gaps (vLLM yields a request, then sleeps a gap).
std::vector<double> poisson_send_times(std::size_t n, double rate, uint64_t seed);

// A uniform double in [0, 1) from the top 53 bits of a 64-bit draw (portable, unlike
// std::uniform_real_distribution's unspecified algorithm).
double unit_uniform(uint64_t bits);

constexpr double kInfiniteRate = std::numeric_limits<double>::infinity();

}  // namespace ossrt::bench
