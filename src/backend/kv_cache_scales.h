#pragma once
// The per-layer, per-KV-head scales of an FP8 KV cache (--kv-cache-dtype fp8, docs/quantization.md
// "FP8 KV cache"), as every backend takes them from BackendOptions::kv_k_scales / kv_v_scales.
#include <vector>

namespace ossrt {

// The scales of `layers` full layers of `heads` KV heads, [layers][heads] row-major: `given` when it
// has that size and every scale is a positive finite number, 1.0 everywhere when it is empty; throws
// ossrt::Error otherwise. `what` ("K" or "V") names the tensor in the error.
std::vector<float> kv_cache_scales_or_ones(const std::vector<float>& given, int layers, int heads, const char* what);

}  // namespace ossrt
