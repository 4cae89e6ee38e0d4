// `ossrt bench cost`: the seed's cost tables on the local engine (src/bench/cost_bench.h,
// docs/bench.md), built from the same runtime flags as serve and generate.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>

#include "bench/cost_report.h"
#include "bench_commands.h"
#include "core/error.h"
#include "runtime_flags.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::tools {

namespace {

struct CostFlags {
  bench::CostBenchOptions o;
  bool no_progress = false, no_prefill = false, no_decode = false;
  std::vector<std::string> from_json;
  std::string decode_text;
};

// --decode-text FILE: {"prompt": text, "continuation": text}, both encoded with the special tokens'
// spellings as their ids (so the prompt may be a rendered Harmony conversation).
void load_decode_text(const std::string& path, const std::string& tokenizer, bench::CostBenchOptions& o) {
  std::ifstream in(path);
  OSSRT_CHECK(in, "--decode-text {}: cannot open the file", path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  OSSRT_CHECK(!j.is_discarded() && j.is_object() && j.contains("prompt") && j["prompt"].is_string() &&
                  j.contains("continuation") && j["continuation"].is_string(),
              "--decode-text {}: expected a JSON object with string fields \"prompt\" and \"continuation\"", path);
  const auto tok = Tokenizer::load(tokenizer.empty() ? default_tokenizer_path() : tokenizer);
  o.decode_prompt = tok->encode_with_special(j["prompt"].get<std::string>());
  o.decode_continuation = tok->encode_with_special(j["continuation"].get<std::string>());
  OSSRT_CHECK(!o.decode_prompt.empty() && !o.decode_continuation.empty(), "--decode-text {}: an empty text", path);
  o.decode_text_label = path;
}

bench::CostBenchResult load_and_merge(const std::vector<std::string>& paths) {
  std::vector<bench::CostBenchResult> runs;
  for (const auto& path : paths) {
    std::ifstream in(path);
    OSSRT_CHECK(in, "--from-json {}: cannot open the file", path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    OSSRT_CHECK(!j.is_discarded(), "--from-json {}: not JSON", path);
    runs.push_back(bench::cost_result_from_json(j, path));
  }
  return bench::merge_cost_results(runs, paths);
}

void run(const CostFlags& f) {
  bench::CostBenchOptions o = f.o;
  o.progress = !f.no_progress && isatty(STDERR_FILENO);
  if (f.no_prefill) o.input_lens.clear();
  if (f.no_decode) o.batch_sizes.clear();
  if (!f.decode_text.empty()) load_decode_text(f.decode_text, o.runtime.tokenizer, o);
  // The files are rewritten after every point: a sweep cut short keeps what it measured.
  if (!o.result_dir.empty())
    o.on_point = [dir = o.result_dir](const bench::CostBenchResult& partial) {
      bench::write_cost_results(partial, dir);
    };
  const bench::CostBenchResult result = f.from_json.empty() ? bench::run_cost_bench(o) : load_and_merge(f.from_json);
  if (!o.result_dir.empty())
    for (const auto& path : bench::write_cost_results(result, o.result_dir))
      std::fprintf(stderr, "wrote %s\n", path.c_str());
  std::fputs((bench::format_prefill_table(result) + "\n" + bench::format_decode_table(result)).c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

void setup_bench_cost(CLI::App& bench) {
  auto f = std::make_shared<CostFlags>();
  bench::CostBenchOptions* o = &f->o;
  CLI::App* cmd = bench.add_subcommand(
      "cost",
      "Prefill latency and decode speed against $ per million tokens on the local engine (scheduler, KV cache, "
      "CUDA graphs): tables, JSON, CSV and SVG plots");
  add_runtime_flags(cmd, o->runtime, RuntimeFlagGroups::ModelAndEngine);
  cmd->add_option(
         "--input-lens", o->input_lens,
         "Prefill: prompt lengths, each measured alone (--repeats requests after a warm-up; skipped where they do "
         "not fit max_model_len or the KV cache)")
      ->delimiter(',')
      ->check(positive_list())
      ->capture_default_str()
      ->group("Cost");
  cmd->add_option("--batch-sizes", o->batch_sizes,
                  "Decode: requests decoding together (--max-num-seqs is raised to the largest; those that do not fit "
                  "the KV cache are skipped)")
      ->delimiter(',')
      ->check(positive_list())
      ->capture_default_str()
      ->group("Cost");
  cmd->add_option("--contexts", o->contexts, "Decode: prompt tokens of each request before it decodes")
      ->delimiter(',')
      ->check(positive_list())
      ->capture_default_str()
      ->group("Cost");
  // A list here, one runtime per format, instead of the one format the other commands take.
  cmd->remove_option(cmd->get_option("--quantization"));
  cmd->add_option(
         "-q,--quantization", o->quantizations,
         "Weight formats to measure, one runtime each, points labelled by the format: auto | bf16 | mxfp4 | "
         "fp8 | mxfp4-fp8 (formats that resolve to the same one on this backend run once; docs/quantization.md)")
      ->delimiter(',')
      ->check(CLI::IsMember(quantization_choices()))
      ->capture_default_str()
      ->group("Cost");
  cmd->add_option("--usd-per-hour", o->usd_per_hour, "Price of one GPU (or the CPU machine) per hour")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Cost");
  cmd->add_option("--repeats", o->repeats,
                  "Prefill: measured requests per length (the median is reported), after one warm-up")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Cost");
  cmd->add_option("--decode-steps", o->decode_steps, "Decode: measured steps per point")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Cost");
  cmd->add_option("--warmup-steps", o->warmup_steps, "Decode: steps of the whole batch before measuring")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Cost");
  cmd->add_option("--decode-text", f->decode_text,
                  "Decode: a JSON file {\"prompt\": ..., \"continuation\": ...}: every request has that prompt "
                  "(--contexts is ignored) and its output is forced to the continuation (the model still computes "
                  "every step), so drafters that read the text (ngram, suffix) are measured on a real continuation "
                  "on any weights, e.g. bench/prompts/code_edit.json")
      ->check(CLI::ExistingFile)
      ->group("Cost");
  cmd->add_option("--prompt-seed", o->seed, "Seed of the random prompt token ids")
      ->capture_default_str()
      ->group("Cost");
  cmd->add_option("--result-dir", o->result_dir,
                  "Write cost.json, cost_prefill.csv, cost_decode.csv, cost_decode.svg, cost_throughput.svg and "
                  "cost_prefill.svg here")
      ->group("Cost");
  cmd->add_flag("--no-prefill", f->no_prefill, "Measure no prefill points (a decode sweep split over several runs)")
      ->group("Cost");
  cmd->add_flag("--no-decode", f->no_decode, "Measure no decode points")->group("Cost");
  cmd->add_option("--from-json", f->from_json,
                  "Measure nothing: read these cost.json files (runs of one model, device, commit and price, e.g. a "
                  "sweep split over several device calls), merge their points and print and write the tables, CSV "
                  "and plots again")
      ->delimiter(',')
      ->check(CLI::ExistingFile)
      ->group("Cost");
  cmd->add_flag("--no-progress", f->no_progress,
                "No progress lines (there are none anyway when stderr is not a terminal)")
      ->group("Cost");
  cmd->callback([f] { run(*f); });
}

}  // namespace ossrt::tools
