// Engine throughput with 64 concurrent requests, each constrained by the Harmony-aware JSON Schema
// constraint (arg 1) or unconstrained (arg 0), on the `tiny` preset (real 201,088-token
// vocabulary, dummy weights) on the CPU backend. Every request generates exactly max_tokens
// (ignore_eos), so both runs do the same model work; the difference is the mask work (on the
// ConstraintMasker thread, beside the forward pass) and applying the masks in the host sampler.
//
// On the CPU every row already goes through the host sampler; on a GPU, constrained rows stay on
// the device sampler (each adds a 25 KB mask to the step's parameter upload), which this machine
// cannot measure.
#include <benchmark/benchmark.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "config/gpt_oss_config.h"
#include "engine/engine.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "structured/compiler.h"
#include "structured/harmony_constraint.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace ossrt;

constexpr int kRequests = 64;
constexpr int kMaxTokens = 24;

const char* kSchema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},
  "age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","format":"email"},
  "tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":5},"active":{"type":"boolean"}},
  "required":["name","age","email","tags","active"],"additionalProperties":false})";

void BM_Engine64Requests(benchmark::State& state) {
  const bool constrained = state.range(0) != 0;
  static const auto tok = Tokenizer::load(default_tokenizer_path());
  static const auto vocab = structured::Vocabulary::from_tokenizer(*tok);
  static structured::GrammarCompiler compiler(vocab);
  const GptOssConfig config = preset_config("tiny");
  static const HostModelWeights weights = make_dummy_weights(config, 0);
  auto backend = make_cpu_backend(BackendOptions{.threads = 2});
  GptOssModel model(*backend, weights, ModelLimits{.max_step_tokens = 2048, .max_logit_rows = kRequests});
  structured::HarmonySpec spec;
  spec.final_format = compiler.json_schema(nlohmann::ordered_json::parse(kSchema));
  spec.final_format->precompute_all();
  spec.reasoning_budget = 0;
  const auto tokens = structured::HarmonyTokens::find(*vocab);

  for (auto _ : state) {
    EngineConfig ec;
    ec.max_num_seqs = kRequests;
    ec.max_num_batched_tokens = 2048;
    ec.num_full_blocks = 512;  // 64 x ~3 blocks needed; no memory-profiling step in a benchmark
    ec.log_memory_plan = false;
    ec.start_thread = false;
    Engine engine(model, ec);
    int64_t generated = 0;
    for (int i = 0; i < kRequests; ++i) {
      GenerationRequest r;
      r.id = fmt::format("r{}", i);
      r.prompt_ids = tok->encode_with_special("<|start|>user<|message|>Describe person " + std::to_string(i) +
                                              " as JSON.<|end|><|start|>assistant");
      r.sampling.temperature = 1.0f;
      r.sampling.seed = uint64_t(i);
      r.sampling.max_tokens = kMaxTokens;
      r.sampling.ignore_eos = true;
      if (constrained)
        r.constraint = std::make_shared<structured::HarmonyConstraint>(spec, vocab, tokens, r.prompt_ids);
      engine.submit(std::move(r),
                    [&generated](const GenerationEvent& ev) { generated += int64_t(ev.token_ids.size()); });
    }
    engine.run_until_idle();
    state.counters["tokens"] = double(generated);
    state.SetItemsProcessed(generated);
  }
  state.SetLabel(constrained ? "64 constrained (JSON Schema, Harmony)" : "64 unconstrained");
}

BENCHMARK(BM_Engine64Requests)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
