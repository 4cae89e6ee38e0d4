#pragma once
// `ossrt bench kernels` on the device (docs/bench.md): every op of the gpt-oss forward on the CUDA
// backend, through the backend's own op interface (the launchers and cuBLASLt calls the model
// uses), at the shapes of the chosen presets and the token counts that matter. Each case is timed
// with CUDA events around the op alone: L2 is flushed before every launch (a read of twice its
// size), a spin kernel keeps the GPU busy while the host enqueues the op, then the op runs; the
// median of --iterations launches after --warmup is reported against the op's floor
// (bench/kernel_floors.h) at the copy bandwidth and bf16 tensor-core rate measured in the same run.
#include "bench/kernel_report.h"

namespace ossrt::bench {

KernelBenchResult run_kernel_bench(const KernelBenchOptions& options);
// Runs, writes kernels.json / kernels.csv under options.result_dir, prints the table last.
void run_kernel_bench_command(const KernelBenchOptions& options);

}  // namespace ossrt::bench
