#pragma once
// The parallelism flags of the engine commands (serve, generate, chat), in one place so their names,
// checks and help agree. The sizes are validated against the model when it loads
// (ParallelConfig::validate) and against the engine (engine_parallel_check: no data parallelism),
// each error naming its flag.
#include <CLI/CLI.hpp>

#include <string>

#include "parallel/parallel_config.h"

namespace ossrt::tools {

inline void add_engine_parallel_flags(CLI::App* cmd, ParallelConfig& parallel) {
  cmd->add_option("--tensor-parallel-size", parallel.tensor_parallel,
                  "Ranks splitting attention heads (by KV-head group), lm_head vocab rows and expert widths")
      ->check(CLI::PositiveNumber)
      ->group("Parallelism");
  cmd->add_option("--expert-parallel-size", parallel.expert_parallel, "Ranks splitting the experts")
      ->check(CLI::PositiveNumber)
      ->group("Parallelism");
  cmd->add_option("--data-parallel-size", parallel.data_parallel,
                  "Data-parallel attention groups: only 1 here (the engine has one scheduler); refused above 1")
      ->check(CLI::PositiveNumber)
      ->group("Parallelism");
  cmd->add_option_function<std::string>(
         "--expert-dispatch",
         [&parallel](const std::string& name) { parallel.moe_dispatch = parse_moe_dispatch(name); },
         "How tokens reach other ranks' experts: replicate (default; every rank routes every token, the combine is "
         "all-reduced) | all_to_all (each rank routes its own rows and exchanges them; needs --expert-parallel-size > "
         "1)")
      ->check(CLI::IsMember({"replicate", "all_to_all"}))
      ->group("Parallelism");
}

}  // namespace ossrt::tools
