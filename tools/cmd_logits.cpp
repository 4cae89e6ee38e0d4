// `ossrt logits`: runs a token list through the model and writes float32 logits [tokens, vocab] as
// a NumPy .npy file, for comparing backends with each other and with HF transformers.
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>

#include "backend/registry/registry.h"
#include "command.h"
#include "core/token_ids_file.h"
#include "core/error.h"
#include "core/npy.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"
#include "parallel/parallel_model.h"
#include "parallel/parallel_sequence_runner.h"

namespace ossrt::tools {
namespace {

struct LogitsOptions {
  std::string model;
  std::string load_format = "auto";
  uint64_t seed = 0;
  std::string ids_file;
  std::string out;
  std::string backend = "cpu";
  int chunk = 256;
  int threads = 0;
  ParallelConfig parallel;
  std::string expert_dispatch = "replicate";  // parallel.moe_dispatch, spelled as on the command line
};

void run_logits(const LogitsOptions& o) {
  using Clock = std::chrono::steady_clock;
  OSSRT_CHECK(o.chunk > 0, "--chunk must be positive");
  const auto t0 = Clock::now();
  const HostModelWeights weights = load_model_weights(ModelSource{o.model, o.load_format, o.seed});
  const std::vector<int32_t> ids = read_token_ids_file(o.ids_file, TokenIdRange{.max_exclusive = weights.config.vocab_size});
  const int n = int(ids.size());

  BackendOptions backend_options;
  backend_options.threads = o.threads;
  const int step = std::min(o.chunk, n);
  const ModelLimits limits{step, step};
  o.parallel.validate(weights.config);  // also on one rank: e.g. --expert-dispatch without experts to split
  std::vector<float> logits;
  auto t1 = Clock::now();
  if (o.parallel.is_single()) {
    std::unique_ptr<Backend> backend = make_backend(o.backend, backend_options);
    GptOssModel model(*backend, weights, limits);
    SingleSequenceRunner runner(model, n);
    t1 = Clock::now();
    logits = runner.run(ids, step, SingleSequenceRunner::Logits::EveryRow);
  } else {
    // One sequence: data parallelism has nothing to split (it runs different sequences per group).
    OSSRT_CHECK(o.parallel.data_parallel == 1,
                "--data-parallel-size {}: `ossrt logits` runs one sequence; data parallelism needs several",
                o.parallel.data_parallel);
    ParallelModel model(weights, o.parallel, o.backend, backend_options, limits);
    ParallelSequenceRunner runner(model, n);
    t1 = Clock::now();
    logits = runner.run(ids, step, SingleSequenceRunner::Logits::EveryRow);
  }
  const auto t2 = Clock::now();
  write_npy_f32(o.out, logits.data(), {int64_t(n), int64_t(weights.config.vocab_size)});
  spdlog::info("logits: {} tokens on {} ({}) in {:.2f} s (load + upload {:.2f} s), wrote {} [{}, {}]", n, o.backend,
               o.parallel.describe(), std::chrono::duration<double>(t2 - t1).count(),
               std::chrono::duration<double>(t1 - t0).count(), o.out, n, weights.config.vocab_size);
}

void setup_logits(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand("logits", "Write float32 logits [tokens, vocab] of a token id list as .npy");
  cmd->add_option("--model", o->model, "Model directory (config.json + safetensors) or preset name")->required();
  cmd->add_option("--load-format", o->load_format, "auto | safetensors | dummy")
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  cmd->add_option("--seed", o->seed, "Seed of dummy weights");
  cmd->add_option("--ids-file", o->ids_file, "JSON array of token ids")->required();
  cmd->add_option("--out", o->out, "Output .npy path")->required();
  cmd->add_option("--backend", o->backend, "cpu | cuda");
  cmd->add_option("--chunk", o->chunk, "Tokens per forward step (chunked prefill)")->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o->threads, "CPU worker threads (0 = all cores; shared by the ranks)");
  cmd->add_option("--tensor-parallel-size", o->parallel.tensor_parallel,
                  "Ranks splitting attention heads (by KV-head group), lm_head vocab and expert widths")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--expert-parallel-size", o->parallel.expert_parallel, "Ranks splitting the experts")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--data-parallel-size", o->parallel.data_parallel,
                  "Attention groups running their own sequences (not for one sequence: refused here)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--expert-dispatch", o->expert_dispatch,
                  "How tokens reach other ranks' experts: replicate (every rank routes every token, the combine "
                  "is all-reduced) | all_to_all (each rank routes its own rows and exchanges them; needs "
                  "--expert-parallel-size > 1)")
      ->check(CLI::IsMember({"replicate", "all_to_all"}));
  cmd->callback([o] {
    o->parallel.moe_dispatch = parse_moe_dispatch(o->expert_dispatch);
    run_logits(*o);
  });
}

}  // namespace

OSSRT_REGISTER_COMMAND(setup_logits);

}  // namespace ossrt::tools
