#pragma once
// Seeded random weights in the real shapes of a config, for benchmarks and tests without files
// (`--load-format dummy`). The public entry point is make_dummy_weights in model/loader.h.
#include <cstdint>

#include "config/gpt_oss_config.h"
#include "model/host_weights.h"

namespace ossrt {

// make_dummy_weights with an explicit worker count (0 = all cores). The values depend only on the
// config and the seed, never on `threads`: every chunk of every tensor has its own RNG stream.
HostModelWeights make_dummy_weights_threaded(const GptOssConfig& config, uint64_t seed, int threads);

}  // namespace ossrt
