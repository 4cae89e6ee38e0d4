// `ossrt bench serve`: the serving benchmark client (src/bench/serve_bench.h, docs/bench.md).
// Flag names follow `vllm bench serve` where it has one (its --random-* names are aliases).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "bench/serve_report.h"
#include "bench_commands.h"
#include "core/error.h"

namespace ossrt::tools {

namespace {

struct ServeFlags {
  bench::ServeBenchOptions o;
  std::string request_rate = "inf";
  std::string slo;
  bool no_progress = false;
  bool no_itl = false;
};

void run(ServeFlags& f) {
  bench::ServeBenchOptions o = f.o;
  if (f.request_rate == "inf" || f.request_rate == "infinity") {
    o.request_rate = bench::kInfiniteRate;
  } else {
    try {
      size_t used = 0;
      o.request_rate = std::stod(f.request_rate, &used);
      OSSRT_CHECK(used == f.request_rate.size() && o.request_rate > 0, "bad");
    } catch (const std::exception&) {
      fail("--request-rate {}: expected a positive number of requests per second, or inf", f.request_rate);
    }
  }
  if (!f.slo.empty()) o.slo = bench::Slo::parse(f.slo);
  o.progress = !f.no_progress && isatty(STDERR_FILENO);
  o.save_itl = !f.no_itl;
  auto result = bench::run_serve_bench(o, [&o](const bench::ServeBenchResult& r, const bench::ServeRun& run) {
    std::fputs(bench::format_run_block(r, run).c_str(), stdout);
    std::fflush(stdout);
    // The files are rewritten after every run: a sweep cut short (a time limit, a crash of the
    // server) keeps the runs that finished.
    if (!o.result_dir.empty()) bench::write_serve_results(r, o.result_dir, o.save_itl);
  });
  if (!o.result_dir.empty()) {
    for (const auto& path : bench::write_serve_results(result, o.result_dir, o.save_itl))
      std::fprintf(stderr, "wrote %s\n", path.c_str());
  }
  std::fputs(("\n" + bench::format_sweep_table(result)).c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

void setup_bench_serve(CLI::App& bench) {
  auto f = std::make_shared<ServeFlags>();
  bench::ServeBenchOptions& o = f->o;
  CLI::App* cmd = bench.add_subcommand(
      "serve",
      "Benchmark an OpenAI-compatible server (ours or any other) over HTTP: streamed requests, TTFT, TPOT, "
      "ITL, E2EL, throughput and goodput, one run per --max-concurrency value");
  // Server
  cmd->add_option("--base-url", o.base_url, "The server, http://HOST:PORT (a trailing /v1 is dropped)")
      ->capture_default_str()
      ->group("Server");
  cmd->add_option("--endpoint", o.endpoint,
                  "/v1/completions (prompts of token ids) or /v1/chat/completions (a user message of text)")
      ->capture_default_str()
      ->group("Server");
  cmd->add_option("--model", o.model, "Model id to send (default: the first of GET /v1/models)")->group("Server");
  cmd->add_option("--api-key", o.api_key, "Sent as 'Authorization: Bearer KEY'")
      ->envname("OPENAI_API_KEY")
      ->group("Server");
  cmd->add_option("--request-timeout", o.request_timeout_s,
                  "Seconds the server may stay silent (connecting, or between two pieces of an answer) before the "
                  "request fails")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Server");
  // Workload
  cmd->add_option("--dataset,--dataset-name", o.dataset.name,
                  "random (seeded token ids of exact lengths) | sharegpt (--dataset-path, the ShareGPT JSON) | file "
                  "(--dataset-path, one JSON request body per line, replayed as given)")
      ->check(CLI::IsMember({"random", "sharegpt", "file"}))
      ->capture_default_str()
      ->group("Workload");
  cmd->add_option("--dataset-path", o.dataset.path, "The ShareGPT JSON or the JSONL file")->group("Workload");
  cmd->add_option("--input-len,--random-input-len", o.dataset.input_len,
                  "random: prompt tokens after the shared prefix")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Workload");
  cmd->add_option("--output-len,--random-output-len", o.dataset.output_len, "random: max_tokens of each request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Workload");
  cmd->add_option("--range-ratio,--random-range-ratio", o.dataset.range_ratio,
                  "random: lengths uniform in [len x (1 - r), len x (1 + r)]")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str()
      ->group("Workload");
  cmd->add_option("--prefix-len,--random-prefix-len", o.dataset.prefix_len,
                  "random: tokens of one prefix shared by every prompt (measures prefix caching)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Workload");
  cmd->add_option("--sharegpt-output-len", o.dataset.sharegpt_output_len,
                  "sharegpt: this max_tokens instead of each conversation's reply length (0 = the reply's)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Workload");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json that measures prompts and makes exact-length ones (default: $OSSRT_TOKENIZER, "
                  "else the bundled gpt-oss one)")
      ->group("Workload");
  cmd->add_option("--seed", o.dataset.seed, "Seed of prompts, lengths and arrival times (same seed, same workload)")
      ->capture_default_str()
      ->group("Workload");
  cmd->add_flag("--ignore-eos", o.ignore_eos, "Send ignore_eos so every answer runs to its max_tokens")
      ->group("Workload");
  cmd->add_option("--temperature", o.temperature, "Sampling temperature of every request (0 = greedy, as vLLM sends)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Workload");
  cmd->add_option("--extra-body", o.extra_body,
                  "A JSON object merged into every request body, e.g. '{\"reasoning_effort\":\"low\"}'")
      ->group("Workload");
  // Load
  cmd->add_option("--request-rate", f->request_rate,
                  "Requests per second, sent as a Poisson process; inf sends them all at once")
      ->capture_default_str()
      ->group("Load");
  cmd->add_option("--max-concurrency", o.max_concurrency,
                  "Most requests in flight; a list (1,8,64,256) runs one benchmark per value (0 = no cap)")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Load");
  cmd->add_option("--num-prompts", o.num_prompts,
                  "Requests per run; one value for every run, or a list matching --max-concurrency")
      ->delimiter(',')
      ->check(positive_list())
      ->capture_default_str()
      ->group("Load");
  cmd->add_option("--warmup", o.warmup,
                  "Requests sent before each run at its concurrency and not measured (CUDA graphs, allocators): random "
                  "and sharegpt draw prompts of their own, file sends its last lines")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Load");
  // Metrics and output
  cmd->add_option("--percentiles,--metric-percentiles", o.percentiles, "Percentiles reported besides mean and median")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str()
      ->group("Output");
  cmd->add_option("--slo,--goodput", f->slo,
                  "Service-level objectives in ms, e.g. ttft=500,tpot=50 (also e2el): goodput counts the requests "
                  "meeting all of them")
      ->group("Output");
  cmd->add_option("--gpus", o.gpus, "GPUs behind the server: output tok/s per GPU and $ per million tokens use it")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Output");
  cmd->add_option("--usd-per-hour", o.usd_per_hour,
                  "Price of one GPU-hour for $ per million output tokens (an H200: 3.00)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Output");
  cmd->add_option("--result-dir", o.result_dir,
                  "Write serve.json (settings, server metadata, metrics, every request), serve_summary.csv, "
                  "serve_requests.csv, serve_throughput.svg and serve_latency.svg here")
      ->group("Output");
  cmd->add_flag("--no-itl", f->no_itl, "Leave each request's inter-token gaps out of serve.json")->group("Output");
  cmd->add_flag("--no-progress", f->no_progress, "No progress bar (there is none anyway when stderr is not a terminal)")
      ->group("Output");
  cmd->callback([f] { run(*f); });
}

}  // namespace ossrt::tools
