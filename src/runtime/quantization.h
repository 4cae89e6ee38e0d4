#pragma once
// `--quantization` (vLLM's flag name): how the backend holds the linear weights. Resolved once, in
// the model runtime, from the flag, the backend and the checkpoint, before the backend is made
// (docs/quantization.md has the table).
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "config/gpt_oss_config.h"

namespace ossrt {

// The values --quantization accepts, in the order --help lists them.
inline constexpr std::string_view kQuantizationChoices[] = {"auto", "bf16", "mxfp4", "fp8", "mxfp4-fp8"};
bool is_quantization_choice(std::string_view requested);

struct ResolvedQuantization {
  WeightFormat format = WeightFormat::Reference;
  // What logs, /v1/server_info, /metrics and benchmarks call it: "f32" (the CPU's reference), "bf16"
  // (CUDA's), "mxfp4", "fp8", "mxfp4-fp8".
  std::string name;
};

// The format `requested` means on `backend` ("cpu" | "cuda") for a checkpoint of `config`:
//   auto       cuda: mxfp4 when the checkpoint's experts are MXFP4, else bf16.   cpu: f32
//   bf16       cuda: bf16 (the reference path).                                  cpu: f32
//   mxfp4      cuda: mxfp4.  cpu: f32, whose experts ARE the MXFP4 values, exactly.
//   fp8        both: fp8 (every linear weight but the router e4m3 per 128x128 block)
//   mxfp4-fp8  both: mxfp4-fp8 (MXFP4 experts as they are, the rest as fp8)
// mxfp4 and mxfp4-fp8 need a checkpoint whose experts are MXFP4; otherwise, and for a value not in
// kQuantizationChoices, an ossrt::Error naming the flag.
ResolvedQuantization resolve_quantization(std::string_view requested, const std::string& backend,
                                          const GptOssConfig& config);

// The name of `format` on `backend`, as above.
std::string weight_format_name(WeightFormat format, const std::string& backend);

// `--kv-cache-dtype` (vLLM's flag name): auto and bf16 cache K and V in the backend's activation
// dtype (bf16 on CUDA, f32 on the CPU); fp8 (or fp8_e4m3) caches the full-attention layers as e4m3
// with one scale per layer and KV head, the window layers as before (docs/quantization.md).
inline constexpr std::string_view kKvCacheDtypeChoices[] = {"auto", "bf16", "fp8", "fp8_e4m3"};
// Throws an ossrt::Error naming the flag for a value not in kKvCacheDtypeChoices.
KvCacheDtype parse_kv_cache_dtype(std::string_view requested);

}  // namespace ossrt
