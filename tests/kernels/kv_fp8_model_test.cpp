// --kv-cache-dtype fp8 through the whole model on CUDA (issue 16, docs/quantization.md "FP8 KV cache"):
//   - the tiny preset (dummy weights) over a 16,384-token context: the CUDA backend with an fp8 KV cache
//     against the CPU backend with an fp8 KV cache (the oracle), on the logits of the last 40 positions
//     (one 32-token step, then 8 one-token steps: the prefill and the decode attention kernels, the
//     latter at 32 splits, over 16k fp8 keys; the fused one-token QKV + RoPE + KV write). Gated as the
//     bf16 path's whole-model test is (model_test.cpp): the GPU's per-position error profile within the
//     bf16 floor, the same CPU fp8 run with its activations rounded to bf16 where the GPU stores bf16
//     (K is then quantized from values that moved by a bf16 rounding, as on the GPU). The difference
//     from a bf16 KV cache (CUDA fp8 against CUDA bf16) is printed, not gated: issue 16 asks to report it.
//     OSSRT_KV_FP8_CONTEXT=N runs another length.
//   - the runtime and the engine on CUDA with --kv-cache-dtype fp8: the cache dtype and the memory plan
//     reported (the full layers at 1 byte an element: twice the tokens of bf16 in the same budget), and
//     batched greedy requests through the decode graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../unit/engine_test_model.h"
#include "backend/registry/registry.h"
#include "cuda_test_util.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"
#include "runtime/model_runtime.h"

namespace ossrt {
namespace {

constexpr int kDefaultContext = 16384;
int context_length() {
  const char* env = std::getenv("OSSRT_KV_FP8_CONTEXT");
  return env != nullptr && std::atoi(env) > 256 ? std::atoi(env) : kDefaultContext;
}
constexpr int kTailStep = 32;    // one step of this many tokens, every row's logits
constexpr int kDecodeSteps = 8;  // then one-token steps
constexpr int kChunk = 1024;     // the prefix's prefill chunks

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Logits [kTailStep + kDecodeSteps, vocab] of the last positions of `ids` on one backend.
std::vector<float> tail_logits(const std::string& backend_name, const HostModelWeights& weights, KvCacheDtype kv,
                               bool emulate_bf16, const std::vector<int32_t>& ids, double* seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  BackendOptions options;
  options.kv_cache_dtype = kv;
  auto backend = make_backend(backend_name, options);
  GptOssModel model(*backend, weights, ModelLimits{kChunk, kTailStep});
  if (emulate_bf16) model.set_observer(test::bf16_storage_emulation());
  SingleSequenceRunner runner(model, int(ids.size()));
  const std::span<const int32_t> all(ids);
  const size_t prefix = ids.size() - kTailStep - kDecodeSteps;
  runner.run(all.first(prefix), kChunk, SingleSequenceRunner::Logits::LastRow);
  std::vector<float> out =
      runner.run(all.subspan(prefix, kTailStep), kTailStep, SingleSequenceRunner::Logits::EveryRow);
  for (int i = 0; i < kDecodeSteps; ++i) {
    const std::vector<float> row =
        runner.run(all.subspan(prefix + kTailStep + size_t(i), 1), 1, SingleSequenceRunner::Logits::EveryRow);
    out.insert(out.end(), row.begin(), row.end());
  }
  *seconds = seconds_since(t0);
  return out;
}

// How far logits `got` are from `ref` ([rows, v]): printed as the CPU accuracy test prints them.
void print_difference(const char* what, const std::vector<float>& got, const std::vector<float>& ref, size_t v) {
  double max_abs = 0, sum_abs = 0, max_ref = 0;
  size_t argmax_agree = 0, rows = ref.size() / v;
  for (size_t r = 0; r < rows; ++r) {
    size_t a_ref = 0, a_got = 0;
    for (size_t i = 0; i < v; ++i) {
      const float a = ref[r * v + i], b = got[r * v + i];
      const double d = std::abs(double(a) - double(b));
      max_abs = std::max(max_abs, d), sum_abs += d, max_ref = std::max(max_ref, std::abs(double(a)));
      if (a > ref[r * v + a_ref]) a_ref = i;
      if (b > got[r * v + a_got]) a_got = i;
    }
    argmax_agree += a_ref == a_got;
  }
  const test::ErrorProfile p = test::profile(test::per_row_rel_l2(got, ref, v));
  std::printf(
      "[kv fp8] %s: max |diff| %.4g, mean |diff| %.4g (max |logit| %.4g), row relative L2 median %.4g / p90 %.4g / "
      "worst %.4g, argmax agrees at %zu/%zu\n",
      what, max_abs, sum_abs / double(ref.size()), max_ref, p.median, p.p90, p.worst, argmax_agree, rows);
}

TEST(CudaKvFp8Model, LongContextMatchesTheCpuFp8CacheWithinTheBf16Floor) {
  OSSRT_SKIP_WITHOUT_GPU();
  const GptOssConfig config = preset_config("tiny");
  const HostModelWeights weights = make_dummy_weights(config, /*seed=*/5);
  std::mt19937 rng(21);
  std::uniform_int_distribution<int32_t> dist(0, config.vocab_size - 1);
  std::vector<int32_t> ids(static_cast<size_t>(context_length()));
  for (int32_t& id : ids) id = dist(rng);
  const size_t v = size_t(config.vocab_size);

  double t_cpu = 0, t_floor = 0, t_gpu = 0, t_gpu_bf16 = 0;
  const std::vector<float> cpu = tail_logits("cpu", weights, KvCacheDtype::Fp8E4m3, false, ids, &t_cpu);
  const std::vector<float> floor = tail_logits("cpu", weights, KvCacheDtype::Fp8E4m3, true, ids, &t_floor);
  const std::vector<float> gpu = tail_logits("cuda", weights, KvCacheDtype::Fp8E4m3, false, ids, &t_gpu);
  const std::vector<float> gpu_bf16 = tail_logits("cuda", weights, KvCacheDtype::Auto, false, ids, &t_gpu_bf16);
  const size_t rows = size_t(kTailStep + kDecodeSteps);
  ASSERT_EQ(cpu.size(), rows * v);
  ASSERT_EQ(gpu.size(), cpu.size());
  ASSERT_EQ(floor.size(), cpu.size());
  ASSERT_EQ(gpu_bf16.size(), cpu.size());
  std::printf(
      "[kv fp8] tiny (dummy weights, seed 5), %zu-token context, last %zu positions; CPU fp8 %.1f s, CPU fp8 "
      "at bf16 storage %.1f s, CUDA fp8 %.1f s, CUDA bf16 %.1f s\n",
      ids.size(), rows, t_cpu, t_floor, t_gpu, t_gpu_bf16);

  // The gate: CUDA fp8 against the CPU's fp8, within the bf16 floor (all positions, then the decode
  // steps' alone too).
  test::expect_within_bf16_floor(test::profile(test::per_row_rel_l2(gpu, cpu, v)),
                                 test::profile(test::per_row_rel_l2(floor, cpu, v)), "fp8 KV, CUDA vs CPU");
  const std::vector<float> gpu_decode(gpu.end() - std::ptrdiff_t(kDecodeSteps * v), gpu.end()),
      cpu_decode(cpu.end() - std::ptrdiff_t(kDecodeSteps * v), cpu.end()),
      floor_decode(floor.end() - std::ptrdiff_t(kDecodeSteps * v), floor.end());
  test::expect_within_bf16_floor(test::profile(test::per_row_rel_l2(gpu_decode, cpu_decode, v)),
                                 test::profile(test::per_row_rel_l2(floor_decode, cpu_decode, v)),
                                 "fp8 KV, CUDA vs CPU, the one-token steps");
  for (float x : gpu) ASSERT_TRUE(std::isfinite(x));

  // The report (not gated): fp8 against bf16 KV on the GPU, and the GPU against the CPU oracle.
  print_difference("CUDA fp8 KV vs CUDA bf16 KV", gpu, gpu_bf16, v);
  print_difference("CUDA fp8 KV vs CPU fp8 KV", gpu, cpu, v);
  print_difference("CPU fp8 KV at bf16 storage vs CPU fp8 KV (the floor)", floor, cpu, v);
}

// The runtime with --kv-cache-dtype fp8 on CUDA: reported dtypes and memory plan (the full layers at
// one byte an element, the window layers bf16), then batched greedy requests through the engine
// (decode graphs on) that all finish.
TEST(CudaKvFp8Model, RuntimeAndEnginePlanAndServeTheFp8Cache) {
  OSSRT_SKIP_WITHOUT_GPU();
  auto options = [](const std::string& kv) {
    RuntimeOptions o;
    o.model = "tiny";
    o.load_format = "dummy";
    o.weights_seed = 3;
    o.backend = "cuda";
    o.kv_cache_dtype = kv;
    o.max_num_batched_tokens = 64;
    o.max_num_seqs = 8;
    o.kv_cache_bytes = size_t(64) << 20;
    return o;
  };
  int64_t bf16_tokens = 0;
  {
    auto bf16 = ModelRuntime::build(options("auto"));
    EXPECT_EQ(bf16->engine().cache_config().cache_dtype, "bfloat16");
    bf16_tokens = bf16->engine().memory_report().kv_tokens;
  }
  testing_engine::EventLog log;  // outlives the engine, whose thread calls it
  auto fp8 = ModelRuntime::build(options("fp8"));
  const std::string line = fp8->engine().memory_report().one_line();
  std::printf("[kv fp8] %s\n[kv fp8] %s\n", fp8->describe().c_str(), line.c_str());
  EXPECT_EQ(fp8->engine().cache_config().cache_dtype, "fp8_e4m3");
  EXPECT_NE(line.find("full-attention layers (fp8_e4m3)"), std::string::npos) << line;
  EXPECT_NE(line.find("window layers (bfloat16)"), std::string::npos) << line;
  // The window pool keeps its size, so the bytes left hold twice bf16's full-layer tokens (to a block).
  EXPECT_GE(fp8->engine().memory_report().kv_tokens, 2 * bf16_tokens);
  EXPECT_LE(fp8->engine().memory_report().kv_tokens, 2 * bf16_tokens + 2 * 16);
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(fp8->engine().submit(
        testing_engine::greedy_request("r" + std::to_string(i), testing_engine::random_prompt(5 + 37 * i, 40 + i), 8),
        log.callback("r" + std::to_string(i))));
  fp8->engine().drain(std::chrono::milliseconds(60000));
  for (int i = 0; i < 4; ++i) {
    const auto s = log.get("r" + std::to_string(i));
    EXPECT_TRUE(s.finished) << i;
    EXPECT_EQ(s.tokens.size(), 8u) << i << ": " << s.final_event.error;
  }
}

}  // namespace
}  // namespace ossrt
