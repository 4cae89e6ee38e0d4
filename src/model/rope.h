#pragma once
// RoPE frequencies (docs/reference/SPEC.md 2.5) as the reference makes them: docs/cpu_backend.md, "RoPE".
#include "backend/backend.h"
#include "config/gpt_oss_config.h"

namespace ossrt {

// inv_freq and the concentration (HF's attention_scaling) for the config, both float32 and bit for bit
// HF transformers' (`_compute_yarn_parameters`, or `compute_default_rope_parameters` without YaRN).
RopeParams compute_rope_params(const GptOssConfig& config);

}  // namespace ossrt
