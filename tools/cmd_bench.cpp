// `ossrt bench`: serve (any OpenAI-compatible server over HTTP), cost (the engine's prefill and
// decode cost tables and plots), kernels (every CUDA op against its floor). docs/bench.md.
#include "bench_commands.h"
#include "command.h"

namespace ossrt::tools {

CLI::Validator positive_list() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          if (std::stoll(v, &used) <= 0 || used != v.size()) return "expected a positive integer, got " + v;
        } catch (const std::exception&) {
          return "expected a positive integer, got " + v;
        }
        return {};
      },
      "POSITIVE");
}

namespace {

void setup_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Benchmarks: `serve` (any OpenAI-compatible server), `cost` (prefill/decode cost tables and plots on the "
      "local engine), `kernels` (CUDA ops against their floors); see docs/bench.md");
  bench->require_subcommand(1);
  setup_bench_serve(*bench);
  setup_bench_cost(*bench);
  setup_bench_kernels(*bench);
}

}  // namespace

OSSRT_REGISTER_COMMAND(setup_bench);

}  // namespace ossrt::tools
