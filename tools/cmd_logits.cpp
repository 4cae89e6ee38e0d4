// `ossrt logits`: runs a token list through the model and writes float32 logits [tokens, vocab] as
// a NumPy .npy file, for comparing backends with each other and with HF transformers.
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>

#include "command.h"
#include "core/error.h"
#include "core/npy.h"
#include "core/token_ids_file.h"
#include "runtime/model_runtime.h"
#include "runtime_flags.h"

namespace ossrt::tools {
namespace {

struct LogitsOptions {
  RuntimeOptions runtime;
  std::string ids_file;
  std::string out;
  int chunk = 256;
};

void run_logits(LogitsOptions o) {
  using Clock = std::chrono::steady_clock;
  OSSRT_CHECK(o.chunk > 0, "--chunk must be positive");
  const auto t0 = Clock::now();
  // The model alone, its step workspaces sized for one chunk with a logit row per token.
  o.runtime.max_num_batched_tokens = o.chunk;
  o.runtime.max_num_seqs = o.chunk;
  auto runtime = ModelRuntime::build(o.runtime, ModelRuntime::Parts::ModelOnly);
  const int vocab = runtime->config().vocab_size;
  const std::vector<int32_t> ids = read_token_ids_file(o.ids_file, TokenIdRange{.max_exclusive = vocab});
  const int n = int(ids.size());
  const auto t1 = Clock::now();
  const std::vector<float> logits = runtime->sequence_logits(ids, o.chunk);
  const auto t2 = Clock::now();
  write_npy_f32(o.out, logits.data(), {int64_t(n), int64_t(vocab)});
  spdlog::info("logits: {} tokens on {} in {:.2f} s (load + upload {:.2f} s), wrote {} [{}, {}]", n,
               runtime->describe(), std::chrono::duration<double>(t2 - t1).count(),
               std::chrono::duration<double>(t1 - t0).count(), o.out, n, vocab);
}

void setup_logits(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand("logits", "Write float32 logits [tokens, vocab] of a token id list as .npy");
  add_runtime_flags(cmd, o->runtime, RuntimeFlagGroups::ModelOnly);
  cmd->add_option("--ids-file", o->ids_file, "JSON array of token ids")->required();
  cmd->add_option("--out", o->out, "Output .npy path")->required();
  cmd->add_option("--chunk", o->chunk, "Tokens per forward step (chunked prefill)")->check(CLI::PositiveNumber);
  cmd->callback([o] { run_logits(*o); });
}

}  // namespace

OSSRT_REGISTER_COMMAND(setup_logits);

}  // namespace ossrt::tools
