// `ossrt bench cost`: the seed's cost tables on the local engine (src/bench/cost_bench.h,
// docs/bench.md), built from the same runtime flags as serve and generate.
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "bench/cost_report.h"
#include "bench_commands.h"
#include "runtime_flags.h"

namespace ossrt::tools {

namespace {

void run(const bench::CostBenchOptions& given, bool no_progress) {
  bench::CostBenchOptions o = given;
  o.progress = !no_progress && isatty(STDERR_FILENO);
  const bench::CostBenchResult result = bench::run_cost_bench(o);
  if (!o.result_dir.empty())
    for (const auto& path : bench::write_cost_results(result, o.result_dir)) std::fprintf(stderr, "wrote %s\n", path.c_str());
  std::fputs((bench::format_prefill_table(result) + "\n" + bench::format_decode_table(result)).c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

void setup_bench_cost(CLI::App& bench) {
  auto o = std::make_shared<bench::CostBenchOptions>();
  auto no_progress = std::make_shared<bool>(false);
  CLI::App* cmd = bench.add_subcommand(
      "cost", "Prefill latency and decode speed against $ per million tokens on the local engine (scheduler, KV cache, "
              "CUDA graphs): tables, JSON, CSV and SVG plots");
  add_runtime_flags(cmd, o->runtime, RuntimeFlagGroups::ModelAndEngine);
  cmd->add_option("--input-lens", o->input_lens, "Prefill: prompt lengths, one request each (skipped where they do not fit)")
      ->delimiter(',')->check(positive_list())->capture_default_str()->group("Cost");
  cmd->add_option("--batch-sizes", o->batch_sizes,
                  "Decode: requests decoding together (--max-num-seqs is raised to the largest; those that do not fit "
                  "the KV cache are skipped)")
      ->delimiter(',')->check(positive_list())->capture_default_str()->group("Cost");
  cmd->add_option("--contexts", o->contexts, "Decode: prompt tokens of each request before it decodes")
      ->delimiter(',')->check(positive_list())->capture_default_str()->group("Cost");
  cmd->add_option("--quantization", o->quantizations,
                  "Weight formats to measure, one run each; today only the current one exists: auto = bf16 on cuda "
                  "(MXFP4 experts expanded at load), f32 on cpu")
      ->delimiter(',')->capture_default_str()->group("Cost");
  cmd->add_option("--usd-per-hour", o->usd_per_hour, "Price of one GPU (or the CPU machine) per hour")
      ->check(CLI::PositiveNumber)->capture_default_str()->group("Cost");
  cmd->add_option("--repeats", o->repeats, "Prefill: measured requests per length (the median is reported), after one warm-up")
      ->check(CLI::PositiveNumber)->capture_default_str()->group("Cost");
  cmd->add_option("--decode-steps", o->decode_steps, "Decode: measured steps per point")
      ->check(CLI::PositiveNumber)->capture_default_str()->group("Cost");
  cmd->add_option("--warmup-steps", o->warmup_steps, "Decode: steps of the whole batch before measuring")
      ->check(CLI::NonNegativeNumber)->capture_default_str()->group("Cost");
  cmd->add_option("--prompt-seed", o->seed, "Seed of the random prompt token ids")->capture_default_str()->group("Cost");
  cmd->add_option("--result-dir", o->result_dir,
                  "Write cost.json, cost_prefill.csv, cost_decode.csv, cost_decode.svg, cost_throughput.svg and "
                  "cost_prefill.svg here")->group("Cost");
  cmd->add_flag("--no-progress", *no_progress, "No progress lines (there are none anyway when stderr is not a terminal)")
      ->group("Cost");
  cmd->callback([o, no_progress] { run(*o, *no_progress); });
}

}  // namespace ossrt::tools
