#include "runtime/quantization.h"

#include <algorithm>
#include <iterator>

#include "core/error.h"

namespace ossrt {

bool is_quantization_choice(std::string_view requested) {
  return std::find(std::begin(kQuantizationChoices), std::end(kQuantizationChoices), requested) !=
         std::end(kQuantizationChoices);
}

std::string weight_format_name(WeightFormat format, const std::string& backend) {
  switch (format) {
    case WeightFormat::Reference: return backend == "cuda" ? "bf16" : "f32";
    case WeightFormat::Mxfp4: return "mxfp4";
    case WeightFormat::Fp8: return "fp8";
    case WeightFormat::Mxfp4Fp8: return "mxfp4-fp8";
  }
  return "?";
}

KvCacheDtype parse_kv_cache_dtype(std::string_view requested) {
  if (requested == "auto" || requested == "bf16") return KvCacheDtype::Auto;
  if (requested == "fp8" || requested == "fp8_e4m3") return KvCacheDtype::Fp8E4m3;
  fail("--kv-cache-dtype must be auto, bf16, fp8 or fp8_e4m3, got '{}'", requested);
}

ResolvedQuantization resolve_quantization(std::string_view requested, const std::string& backend,
                                          const GptOssConfig& config) {
  OSSRT_CHECK(is_quantization_choice(requested), "--quantization must be auto, bf16, mxfp4, fp8 or mxfp4-fp8, got '{}'",
              requested);
  const bool gpu = backend == "cuda";
  if (requested == "mxfp4" || requested == "mxfp4-fp8")
    OSSRT_CHECK(config.experts_mxfp4,
                "--quantization {}: the experts of {} are not MXFP4 (no quantization_config.quant_method \"mxfp4\"); "
                "use bf16 or fp8",
                requested, config.name);
  WeightFormat format = WeightFormat::Reference;
  if (requested == "auto")
    format = gpu && config.experts_mxfp4 ? WeightFormat::Mxfp4 : WeightFormat::Reference;
  else if (requested == "mxfp4")
    // The CPU's f32 experts are the MXFP4 values exactly: its reference path already is "mxfp4".
    format = gpu ? WeightFormat::Mxfp4 : WeightFormat::Reference;
  else if (requested == "fp8")
    format = WeightFormat::Fp8;
  else if (requested == "mxfp4-fp8")
    format = WeightFormat::Mxfp4Fp8;
  return {format, weight_format_name(format, backend)};
}

}  // namespace ossrt
