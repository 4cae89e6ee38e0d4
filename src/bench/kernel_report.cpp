#include "bench/kernel_report.h"

#include <fmt/format.h>

#include "bench/table.h"

namespace ossrt::bench {

namespace {
std::string case_name(const KernelResult& c) {
  return c.phase == "decode" ? fmt::format("decode {} x 1 @ {}", c.seqs, c.context)
                             : fmt::format("prefill {}", c.tokens);
}
}  // namespace

std::string format_kernel_table(const KernelBenchResult& r) {
  TextTable t({"model", "op", "case", "MB", "GFLOP", "floor us", "bound", "median us", "x floor", "GB/s", "TFLOP/s"});
  for (const auto& c : r.cases) {
    t.add({c.model, c.op, case_name(c), fmt::format("{:.2f}", c.bytes / 1e6), fmt::format("{:.3f}", c.flops / 1e9),
           fmt::format("{:.1f}", c.floor_s * 1e6), c.bound, fmt::format("{:.1f}", c.median_s * 1e6),
           fmt::format("{:.2f}", c.ratio()), fmt::format("{:.0f}", c.median_s > 0 ? c.bytes / c.median_s / 1e9 : 0),
           fmt::format("{:.1f}", c.median_s > 0 ? c.flops / c.median_s / 1e12 : 0)});
  }
  return fmt::format(
      "ossrt bench kernels: {}, copy {:.2f} TB/s, bf16 GEMM {:.0f} TFLOP/s (both measured in this run), commit {}\n"
      "floor = max(bytes / copy bandwidth, FLOPs / bf16 rate); median of timed launches with L2 flushed before "
      "each\n{}",
      r.machine.gpu, r.machine.copy_bytes_per_s / 1e12, r.machine.bf16_flops_per_s / 1e12, r.commit.substr(0, 12),
      t.str());
}

nlohmann::json kernel_result_json(const KernelBenchResult& r) {
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& c : r.cases)
    cases.push_back({{"model", c.model},
                     {"op", c.op},
                     {"kernels", c.kernels},
                     {"phase", c.phase},
                     {"tokens", c.tokens},
                     {"seqs", c.seqs},
                     {"context", c.context},
                     {"bytes", c.bytes},
                     {"flops", c.flops},
                     {"distinct_experts", c.distinct_experts},
                     {"floor_s", c.floor_s},
                     {"bound", c.bound},
                     {"median_s", c.median_s},
                     {"p10_s", c.p10_s},
                     {"p90_s", c.p90_s},
                     {"ratio", c.ratio()}});
  return {{"benchmark", "ossrt bench kernels"},
          {"format_version", 1},
          {"date", r.date},
          {"commit", r.commit},
          {"machine",
           {{"gpu", r.machine.gpu},
            {"copy_bytes_per_s", r.machine.copy_bytes_per_s},
            {"bf16_flops_per_s", r.machine.bf16_flops_per_s},
            {"l2_bytes", r.machine.l2_bytes},
            {"sms", r.machine.sms}}},
          {"settings", r.settings},
          {"definitions",
           {{"bytes",
             "the least HBM traffic of the op: inputs read once, outputs written once, each weight (MoE: each "
             "routed expert) read once (src/bench/kernel_floors.h)"},
            {"floor_s", "max(bytes / copy_bytes_per_s, flops / bf16_flops_per_s)"},
            {"median_s", "median over timed launches, CUDA events around the op alone, L2 flushed before each"},
            {"moe", "expert ids are random (k distinct per token, uniform), as dummy weights route nearly uniformly"}}},
          {"cases", cases},
          {"errors", r.errors}};
}

std::vector<std::string> write_kernel_results(const KernelBenchResult& r, const std::string& dir) {
  std::vector<std::string> paths;
  paths.push_back(write_text_file(dir, "kernels.json", kernel_result_json(r).dump(1) + "\n"));
  TextTable csv({"model", "op", "kernels", "phase", "tokens", "seqs", "context", "bytes", "flops", "distinct_experts",
                 "floor_s", "bound", "median_s", "p10_s", "p90_s", "ratio"});
  for (const auto& c : r.cases)
    csv.add({c.model, c.op, c.kernels, c.phase, std::to_string(c.tokens), std::to_string(c.seqs),
             std::to_string(c.context), fmt::format("{}", c.bytes), fmt::format("{}", c.flops),
             fmt::format("{}", c.distinct_experts), fmt::format("{}", c.floor_s), c.bound,
             fmt::format("{}", c.median_s), fmt::format("{}", c.p10_s), fmt::format("{}", c.p90_s),
             fmt::format("{}", c.ratio())});
  paths.push_back(write_text_file(dir, "kernels.csv", csv.csv()));
  return paths;
}

}  // namespace ossrt::bench
