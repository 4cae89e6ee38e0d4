#pragma once
// The flags that build the model runtime (runtime/runtime_options.h), declared once for every
// command so names, meanings and checks agree (vLLM's names where vLLM has one). A command picks
// the groups it needs: `logits` runs the model alone (no memory plan, no scheduler), the engine
// commands take them all. Per-command defaults are set on the options before the flags are added.
#include <CLI/CLI.hpp>

#include <iterator>
#include <string>
#include <vector>

#include "parallel_flags.h"
#include "runtime/quantization.h"
#include "runtime/runtime_options.h"

namespace ossrt::tools {

enum class RuntimeFlagGroups { ModelOnly, ModelAndEngine };

// --quantization's values (runtime/quantization.h), for CLI11's check.
inline std::vector<std::string> quantization_choices() {
  return {std::begin(kQuantizationChoices), std::end(kQuantizationChoices)};
}

// --kv-cache-dtype's values (runtime/quantization.h).
inline std::vector<std::string> kv_cache_dtype_choices() {
  return {std::begin(kKvCacheDtypeChoices), std::end(kKvCacheDtypeChoices)};
}

inline void add_runtime_flags(CLI::App* cmd, RuntimeOptions& o, RuntimeFlagGroups groups) {
  cmd->add_option("--model", o.model, "Checkpoint directory or preset (tiny, gpt-oss-20b, gpt-oss-120b)")
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--load-format", o.load_format, "auto | safetensors | dummy (seeded random weights)")
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--weights-seed", o.weights_seed, "Seed of dummy weights")->capture_default_str()->group("Model");
  cmd->add_option("--tokenizer", o.tokenizer, "tokenizer.json (default: the model's, else the bundled one)")
      ->group("Model");
  cmd->add_option("--backend", o.backend, "cpu | cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("-q,--quantization", o.quantization,
                  "Weight format: auto (cuda: mxfp4 for MXFP4 checkpoints, else bf16; cpu: f32) | bf16 | mxfp4 | fp8 "
                  "(e4m3, 128x128 block scales, activations per 1x128) | mxfp4-fp8 (MXFP4 experts, fp8 attention and "
                  "unembedding); docs/quantization.md")
      ->check(CLI::IsMember(quantization_choices()))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--kv-cache-dtype", o.kv_cache_dtype,
                  "KV cache dtype: auto (the model's: bf16 on cuda, f32 on cpu) | bf16 | fp8 = fp8_e4m3 (the "
                  "full-attention layers as e4m3 with a scale per layer and KV head, about twice the tokens in the "
                  "same memory; window layers unchanged; cpu only for now); docs/quantization.md")
      ->check(CLI::IsMember(kv_cache_dtype_choices()))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--threads", o.threads, "CPU backend threads (0 = all cores; shared by the ranks)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Model");
  add_engine_parallel_flags(cmd, o.parallel);
  if (groups == RuntimeFlagGroups::ModelOnly) return;

  cmd->add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                  "Fraction of the GPU's memory (CPU: of available system memory) for weights, activations and "
                  "the KV cache; the KV cache gets what a profiling step leaves")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str()
      ->group("Memory");
  cmd->add_option("--kv-cache-bytes", o.kv_cache_bytes, "KV cache size in bytes, instead of the profiled plan")
      ->group("Memory");
  cmd->add_option("--max-model-len", o.max_model_len,
                  "Context length (default: the model's own, lowered with a warning to what the KV cache holds; "
                  "given explicitly, the server refuses to start when it does not fit)")
      ->check(CLI::NonNegativeNumber)
      ->group("Memory");
  cmd->add_option("--block-size", o.block_size, "KV block size in tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Memory");
  const bool command_default = o.max_num_seqs > 0;  // generate/chat set theirs; others follow the backend
  auto* seqs = cmd->add_option("--max-num-seqs", o.max_num_seqs,
                               command_default ? "Most sequences in a running batch"
                                               : "Most sequences in a running batch (default: 256 on cuda, 64 on cpu)")
                   ->check(CLI::PositiveNumber)
                   ->group("Scheduler");
  auto* tokens =
      cmd->add_option("--max-num-batched-tokens", o.max_num_batched_tokens,
                      command_default ? "Token budget per step (chunked prefill); workspaces are sized for it"
                                      : "Token budget per step (chunked prefill); workspaces are sized for it "
                                        "(default: 8192 on cuda, 2048 on cpu)")
          ->check(CLI::PositiveNumber)
          ->group("Scheduler");
  if (command_default) {
    seqs->capture_default_str();
    tokens->capture_default_str();
  }
  cmd->add_option("--max-queue", o.max_queue, "Most waiting requests; beyond it a request is refused (429)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Scheduler");
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.enable_prefix_caching,
                "Reuse KV blocks of shared prompt prefixes")
      ->group("Scheduler");
  cmd->add_option("--seed", o.seed, "Sampling seed of requests that bring none (reproducible sampling)")
      ->group("Scheduler");
  cmd->add_option("--speculative-config", o.speculative_config,
                  "Speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}' "
                  "(methods ngram, suffix, draft_model with \"model\" (cpu only), eagle3 with \"model\" (an EAGLE-3 "
                  "head directory; cpu only), replay (benchmarks); docs/engine.md); "
                  "greedy output unchanged, sampled output distributed as without it")
      ->group("Scheduler");
}

}  // namespace ossrt::tools
