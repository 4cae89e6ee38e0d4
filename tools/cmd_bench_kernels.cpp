// `ossrt bench kernels`: every CUDA op at gpt-oss shapes against its floor (src/bench/cuda,
// docs/bench.md). Built with CUDA only; elsewhere the command says so and fails.
#include <cstdio>
#include <memory>

#include "bench/kernel_report.h"
#include "bench_commands.h"
#include "core/error.h"
#include "runtime_flags.h"
#ifdef OSSRT_HAS_KERNEL_BENCH
#include "bench/cuda/kernel_bench.h"
#endif

namespace ossrt::tools {

void setup_bench_kernels(CLI::App& bench) {
  auto o = std::make_shared<bench::KernelBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "kernels",
      "Time every CUDA op (CUDA events, after warm-up, L2 flushed before each launch) at gpt-oss-20b/120b shapes "
      "against its floor from minimum bytes and FLOPs at the measured copy bandwidth and tensor-core rate");
  cmd->add_option("--models", o->models, "Model presets whose shapes are used")
      ->delimiter(',')
      ->check(CLI::IsMember({"tiny", "gpt-oss-20b", "gpt-oss-120b"}))
      ->capture_default_str();
  cmd->add_option("--decode-tokens", o->decode_tokens, "Decode cases: sequences of one token each")
      ->delimiter(',')
      ->check(positive_list())
      ->capture_default_str();
  cmd->add_option("--prefill-tokens", o->prefill_tokens, "Prefill cases: one sequence of this many tokens")
      ->delimiter(',')
      ->check(positive_list())
      ->capture_default_str();
  cmd->add_option("--decode-context", o->decode_context, "KV positions each decoding sequence attends to")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--iterations", o->iterations, "Timed launches per case (median reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed launches before timing")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--ops", o->ops, "Only these ops (default: all; names as in the table)")->delimiter(',');
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "The full-attention layers' KV cache: fp8 times rope_kv_write and attention_full on e4m3 (floors at "
                  "1 byte a cached element)")
      ->check(CLI::IsMember(kv_cache_dtype_choices()))
      ->capture_default_str();
  cmd->add_option("--device", o->device, "CUDA device index")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--result-dir", o->result_dir, "Write kernels.json and kernels.csv here");
  cmd->callback([o] {
#ifdef OSSRT_HAS_KERNEL_BENCH
    bench::run_kernel_bench_command(*o);
#else
    fail(
        "`ossrt bench kernels` needs the CUDA backend: this ossrt was built without CUDA (configure with nvcc "
        "available, -DOSSRT_CUDA=ON)");
#endif
  });
}

}  // namespace ossrt::tools
