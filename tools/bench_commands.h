#pragma once
// `ossrt bench` has three modes, each set up in its own cmd_bench_<mode>.cpp; cmd_bench.cpp adds
// the parent command and calls these in a fixed order (static registration across files has none).
#include <CLI/CLI.hpp>

namespace ossrt::tools {

void setup_bench_serve(CLI::App& bench);
void setup_bench_cost(CLI::App& bench);
void setup_bench_kernels(CLI::App& bench);

// "1,2,4" or "1 2 4" style lists are parsed by CLI11 (delimiter ','); these check them.
CLI::Validator positive_list();

}  // namespace ossrt::tools
