// `ossrt generate`: one request through the engine (the same continuous-batching path the server
// uses), streaming text or printing {"ids": [...], "text": "..."}. Without --model it runs the
// embedded default: preset `tiny` with seeded dummy weights and the bundled tokenizer.
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <optional>

#include "command.h"
#include "config/gpt_oss_config.h"
#include "core/error.h"
#include "core/token_ids_file.h"
#include "engine/engine.h"
#include "engine/memory_profile.h"
#include "runtime/model_runtime.h"
#include "runtime_flags.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::tools {
namespace {

struct GenerateOptions {
  RuntimeOptions runtime;
  std::string prompt;
  std::string prompt_ids_file;
  bool parse_special = false;
  int max_tokens = 64;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;
  std::string format = "text";
  bool verbose = false;
};

void run_generate(const GenerateOptions& o) {
  using Clock = std::chrono::steady_clock;
  OSSRT_CHECK(o.prompt.empty() != o.prompt_ids_file.empty(), "give exactly one of --prompt or --prompt-ids-file");
  auto runtime = ModelRuntime::build(o.runtime);
  std::shared_ptr<const Tokenizer> tokenizer = runtime->tokenizer();
  OSSRT_CHECK(tokenizer || o.prompt.empty(),
              "--prompt needs a tokenizer: pass --tokenizer PATH (or use --prompt-ids-file)");
  OSSRT_CHECK(tokenizer || o.format == "json",
              "text output needs a tokenizer: pass --tokenizer PATH or use --format json");
  OSSRT_CHECK(tokenizer || o.stop.empty(), "--stop needs a tokenizer: pass --tokenizer PATH");

  std::vector<int32_t> prompt_ids;
  if (!o.prompt.empty()) {
    prompt_ids = o.parse_special ? tokenizer->encode_with_special(o.prompt) : tokenizer->encode(o.prompt);
    OSSRT_CHECK(!prompt_ids.empty(), "the prompt encodes to no tokens");
  } else {
    prompt_ids = read_token_ids_file(o.prompt_ids_file, TokenIdRange{});
  }

  Engine& engine = runtime->engine();
  const GptOssConfig& config = runtime->config();
  const auto t1 = Clock::now();
  if (o.verbose) {
    spdlog::info("model {} ({} layers, vocab {}), {}, loaded in {:.2f} s", config.name, config.num_layers,
                 config.vocab_size, runtime->describe(), runtime->load_seconds());
    std::fputs((engine.memory_report().one_line() + "\n").c_str(), stderr);
    std::fputs(describe_memory_plan(engine.memory_plan(), config).c_str(), stderr);
  }

  GenerationRequest request;
  request.id = "generate";
  request.prompt_ids = prompt_ids;
  SamplingParams& sp = request.sampling;
  sp.temperature = o.temperature;
  sp.top_p = o.top_p;
  sp.top_k = o.top_k;
  sp.min_p = o.min_p;
  sp.repetition_penalty = o.repetition_penalty;
  sp.presence_penalty = o.presence_penalty;
  sp.frequency_penalty = o.frequency_penalty;
  sp.seed = o.runtime.seed;
  sp.max_tokens = o.max_tokens;
  sp.stop_strings = o.stop;
  sp.stop_token_ids = o.stop_token_ids;
  sp.ignore_eos = o.ignore_eos;
  sp.logprobs = o.logprobs;

  const bool stream_text = o.format == "text";
  std::unique_ptr<IncrementalDecoder> decoder;
  if (stream_text) decoder = std::make_unique<IncrementalDecoder>(tokenizer);
  std::vector<int32_t> ids;
  nlohmann::json logprobs = nlohmann::json::array();
  std::promise<GenerationEvent> finished;
  // Runs on the engine thread; nothing else touches ids/decoder until `finished` is set.
  const bool accepted = engine.submit(std::move(request), [&](const GenerationEvent& ev) {
    ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    for (const auto& lp : ev.logprobs) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [id, v] : lp.top) top.push_back({{"id", id}, {"logprob", v}});
      logprobs.push_back({{"id", lp.id}, {"logprob", lp.logprob}, {"top", top}});
    }
    if (decoder) {
      for (int32_t id : ev.token_ids) std::fputs(decoder->push(id).c_str(), stdout);
      std::fflush(stdout);
    }
    if (ev.finished) finished.set_value(ev);
  });
  OSSRT_CHECK(accepted, "the engine refused the request");
  const GenerationEvent last = finished.get_future().get();
  const auto t2 = Clock::now();
  if (last.finish_reason == FinishReason::Error) fail("generation failed: {}", last.error);

  if (stream_text) {
    std::fputs(decoder->flush().c_str(), stdout);
    std::fputs("\n", stdout);
  } else {
    nlohmann::json out;
    out["ids"] = ids;
    if (tokenizer) out["text"] = tokenizer->decode(ids);
    out["finish_reason"] = finish_reason_name(last.finish_reason);
    if (o.logprobs >= 0) out["logprobs"] = logprobs;
    std::puts(out.dump().c_str());
  }
  std::fflush(stdout);
  if (o.verbose) {
    const double total = std::chrono::duration<double>(t2 - t1).count();
    const double decode = std::max(1e-9, last.e2e_latency - last.time_to_first_token);
    spdlog::info(
        "{} prompt tokens ({} cached), {} generated, finish {}: TTFT {:.3f} s, {:.1f} tok/s decode, {:.2f} s total",
        last.prompt_tokens, last.cached_prompt_tokens, last.completion_tokens, finish_reason_name(last.finish_reason),
        last.time_to_first_token, last.completion_tokens > 1 ? (last.completion_tokens - 1) / decode : 0.0, total);
    if (engine.config().speculative.enabled()) {
      engine.drain(std::chrono::seconds(10));  // the step that finished the request publishes its counters
      const GeneratorStats s = engine.stats();
      const SpeculativeConfig& sc = engine.config().speculative;
      if (s.spec_drafts == 0)
        spdlog::info("speculative decoding ({}, k = {}): the drafter had no guess at any step", sc.method,
                     sc.num_speculative_tokens);
      else
        spdlog::info(
            "speculative decoding ({}, k = {}): {} verify steps with guesses, {} of {} guesses accepted, mean "
            "acceptance length {:.2f}",
            sc.method, sc.num_speculative_tokens, s.spec_drafts, s.spec_accepted_tokens, s.spec_draft_tokens,
            s.spec_mean_acceptance_length());
    }
  }
}

void setup_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  // One request at a time: a batch of one, chunked prefill in 512-token steps.
  o->runtime.max_num_seqs = 1;
  o->runtime.max_num_batched_tokens = 512;
  o->runtime.max_queue = 1;
  CLI::App* cmd = app.add_subcommand("generate", "Generate from a prompt (text or token ids) through the engine");
  add_runtime_flags(cmd, o->runtime, RuntimeFlagGroups::ModelAndEngine);
  cmd->add_option("--prompt", o->prompt, "Prompt text (encoded as ordinary text; no chat template)");
  cmd->add_option("--prompt-ids-file", o->prompt_ids_file, "JSON array of prompt token ids");
  cmd->add_flag("--parse-special", o->parse_special, "Let special tokens spelled in --prompt become their ids");
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate at most")->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o->temperature, "0 = greedy")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass");
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0 = off)");
  cmd->add_option("--min-p", o->min_p, "Drop tokens below min_p x the top probability");
  cmd->add_option("--repetition-penalty", o->repetition_penalty);
  cmd->add_option("--presence-penalty", o->presence_penalty);
  cmd->add_option("--frequency-penalty", o->frequency_penalty);
  cmd->add_option("--stop", o->stop, "Stop string (repeatable)");
  cmd->add_option("--stop-token-id", o->stop_token_ids, "Extra stop token id (repeatable)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the model's EOS tokens");
  cmd->add_option("--logprobs", o->logprobs, "Top alternatives per token in the JSON output (-1 = none)");
  cmd->add_option("--format", o->format, "text (stream) | json")->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--verbose", o->verbose, "Print the memory plan and timings to stderr");
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace

OSSRT_REGISTER_COMMAND(setup_generate);

}  // namespace ossrt::tools
