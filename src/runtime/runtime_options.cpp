#include "runtime/runtime_options.h"

#include "core/error.h"
#include "engine/drafter.h"
#include "runtime/quantization.h"

namespace ossrt {

void RuntimeOptions::validate() const {
  OSSRT_CHECK(load_format == "auto" || load_format == "safetensors" || load_format == "dummy",
              "--load-format must be auto, safetensors or dummy, got '{}'", load_format);
  OSSRT_CHECK(is_quantization_choice(quantization),
              "--quantization must be auto, bf16, mxfp4, fp8 or mxfp4-fp8, got '{}'", quantization);
  parse_kv_cache_dtype(kv_cache_dtype);  // throws naming the flag
  OSSRT_CHECK(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0,
              "--gpu-memory-utilization must be in (0, 1], got {}", gpu_memory_utilization);
  OSSRT_CHECK(max_model_len >= 0, "--max-model-len must not be negative, got {}", max_model_len);
  OSSRT_CHECK(block_size > 0, "--block-size must be positive, got {}", block_size);
  OSSRT_CHECK(max_num_seqs >= 0, "--max-num-seqs must be positive, got {}", max_num_seqs);
  OSSRT_CHECK(max_num_batched_tokens >= 0, "--max-num-batched-tokens must be positive, got {}", max_num_batched_tokens);
  OSSRT_CHECK(max_queue >= 0, "--max-queue must not be negative, got {}", max_queue);
  OSSRT_CHECK(threads >= 0, "--threads must not be negative, got {}", threads);
  const SpeculativeConfig speculative = parse_speculative_config(speculative_config);  // throws naming the field
  // The CUDA memory plan does not count a second model and its cache yet, and the path has not been
  // measured on a GPU: refused before anything loads rather than left to run out of memory.
  OSSRT_CHECK(speculative.method != "draft_model" || backend != "cuda",
              "--speculative-config draft_model: not on --backend cuda yet (cpu only)");
  OSSRT_CHECK(speculative.method != "eagle3" || parallel.is_single(),
              "--speculative-config eagle3: one rank only for now (no tensor or expert parallelism)");
}

RuntimeOptions RuntimeOptions::with_backend_defaults() const {
  RuntimeOptions o = *this;
  const bool gpu = backend == "cuda";
  if (o.max_num_seqs == 0) o.max_num_seqs = gpu ? 256 : 64;
  // CUDA's token budget is measured (docs/bench.md, "The per-step token budget"): 8,192 keeps
  // 16,384's throughput and TTFT with a shorter ITL tail while prompts arrive among decoding streams.
  if (o.max_num_batched_tokens == 0) o.max_num_batched_tokens = gpu ? 8192 : 2048;
  return o;
}

}  // namespace ossrt
