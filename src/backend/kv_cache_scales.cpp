#include "backend/kv_cache_scales.h"

#include <cmath>

#include "core/error.h"

namespace ossrt {

std::vector<float> kv_cache_scales_or_ones(const std::vector<float>& given, int layers, int heads, const char* what) {
  const size_t n = size_t(layers) * size_t(heads);
  if (given.empty()) return std::vector<float>(n, 1.0f);
  OSSRT_CHECK(given.size() == n, "--kv-cache-dtype fp8: {} {} scales for {} full layers x {} KV heads", given.size(),
              what, layers, heads);
  for (float s : given)
    OSSRT_CHECK(std::isfinite(s) && s > 0.0f, "--kv-cache-dtype fp8: {} scale {} is not a positive finite number", what,
                s);
  return given;
}

}  // namespace ossrt
