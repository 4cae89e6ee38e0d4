#pragma once
// The element type of one layer's paged KV cache, as the kernels that write it (rope_cache.cuh, the
// fused QKV + RoPE kernels) and read it (attention.cuh) see it. Host-safe: the backend picks it per
// layer (the full-attention layers under --kv-cache-dtype fp8 are Fp8E4m3, every other layer Bf16;
// docs/quantization.md "FP8 KV cache").
#include <cstdint>

namespace ossrt::cuda {

enum class KvCacheElem : uint8_t {
  Bf16,     // the value rounded to bf16
  Fp8E4m3,  // core/fp8.h's e4m3_from_f32(value / scale), one fp32 scale per layer and KV head
};

}  // namespace ossrt::cuda
