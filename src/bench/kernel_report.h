#pragma once
// `ossrt bench kernels`: its options, results, table and files. The runner needs the CUDA backend
// (bench/cuda/kernel_bench.h, CUDA builds only); what is here builds everywhere, so the command
// line, the report and its tests are the same in every build.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ossrt::bench {

struct KernelBenchOptions {
  std::vector<std::string> models = {"gpt-oss-20b", "gpt-oss-120b"};  // presets: the shapes
  std::vector<int> decode_tokens = {1, 8, 64, 256};  // decode cases: one token of each of this many sequences
  std::vector<int> prefill_tokens = {1024, 8192};    // prefill cases: one sequence of this many tokens
  int decode_context = 1024;                         // KV positions each decoding sequence attends to
  int iterations = 100;                              // timed launches per case (the median is reported)
  int warmup = 10;                                   // untimed launches first
  std::vector<std::string> ops;                      // only these ops (empty: all)
  // --kv-cache-dtype (runtime/quantization.h): fp8 times rope_kv_write and attention_full on the full
  // layers' e4m3 cache, their floors at 1 byte a cached element (attention_sliding stays bf16).
  std::string kv_cache_dtype = "auto";
  std::string result_dir;
  int device = 0;
};

struct MachineRates {
  std::string gpu;
  double copy_bytes_per_s = 0;  // device-to-device copy, read + write bytes
  double bf16_flops_per_s = 0;  // cuBLASLt bf16 GEMM 8192^3 through the backend's linear op
  size_t l2_bytes = 0;
  int sms = 0;
};

struct KernelResult {
  std::string model, op, kernels, phase;
  int tokens = 0, seqs = 0, context = 0;
  double bytes = 0, flops = 0, distinct_experts = 0;
  double floor_s = 0, median_s = 0, p10_s = 0, p90_s = 0;
  std::string bound;  // "memory" | "compute": which term sets the floor
  double ratio() const { return floor_s > 0 ? median_s / floor_s : 0; }
};

struct KernelBenchResult {
  std::string date, commit;
  MachineRates machine;
  nlohmann::json settings;
  std::vector<KernelResult> cases;
  std::vector<std::string> errors;  // cases that could not run (each names model, op and case)
};

std::string format_kernel_table(const KernelBenchResult& r);
nlohmann::json kernel_result_json(const KernelBenchResult& r);
// kernels.json and kernels.csv; returns their paths.
std::vector<std::string> write_kernel_results(const KernelBenchResult& r, const std::string& dir);

}  // namespace ossrt::bench
