// --quantization: the resolution table of runtime/quantization.h on both backends and both kinds of
// checkpoint, the refusals, and the tiny model end to end through the runtime builder with each
// format on the CPU (fp8 moves random-weight logits by a visible, bounded amount).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "config/gpt_oss_config.h"
#include "core/error.h"
#include "runtime/model_runtime.h"
#include "runtime/quantization.h"

namespace ossrt {
namespace {

GptOssConfig checkpoint(bool experts_mxfp4) {
  GptOssConfig c = preset_config("tiny");
  c.experts_mxfp4 = experts_mxfp4;
  return c;
}

std::string resolved(const std::string& requested, const std::string& backend, bool mxfp4) {
  const ResolvedQuantization r = resolve_quantization(requested, backend, checkpoint(mxfp4));
  EXPECT_EQ(r.name, weight_format_name(r.format, backend));
  return r.name;
}

TEST(Quantization, ResolutionTable) {
  // cuda
  EXPECT_EQ(resolved("auto", "cuda", true), "mxfp4");
  EXPECT_EQ(resolved("auto", "cuda", false), "bf16");
  EXPECT_EQ(resolved("bf16", "cuda", true), "bf16");
  EXPECT_EQ(resolved("mxfp4", "cuda", true), "mxfp4");
  EXPECT_EQ(resolved("fp8", "cuda", true), "fp8");
  EXPECT_EQ(resolved("fp8", "cuda", false), "fp8");
  EXPECT_EQ(resolved("mxfp4-fp8", "cuda", true), "mxfp4-fp8");
  // cpu: f32 is the checkpoint's values, MXFP4 experts exactly
  EXPECT_EQ(resolved("auto", "cpu", true), "f32");
  EXPECT_EQ(resolved("auto", "cpu", false), "f32");
  EXPECT_EQ(resolved("bf16", "cpu", true), "f32");
  EXPECT_EQ(resolved("mxfp4", "cpu", true), "f32");
  EXPECT_EQ(resolved("fp8", "cpu", false), "fp8");
  EXPECT_EQ(resolved("mxfp4-fp8", "cpu", true), "mxfp4-fp8");

  EXPECT_EQ(resolve_quantization("auto", "cuda", checkpoint(true)).format, WeightFormat::Mxfp4);
  EXPECT_EQ(resolve_quantization("bf16", "cuda", checkpoint(true)).format, WeightFormat::Reference);
  EXPECT_EQ(resolve_quantization("mxfp4", "cpu", checkpoint(true)).format, WeightFormat::Reference);
  EXPECT_EQ(resolve_quantization("fp8", "cpu", checkpoint(true)).format, WeightFormat::Fp8);
  EXPECT_EQ(resolve_quantization("mxfp4-fp8", "cpu", checkpoint(true)).format, WeightFormat::Mxfp4Fp8);
  // Both official models and the presets are MXFP4 checkpoints.
  for (const std::string& preset : preset_names())
    EXPECT_EQ(resolve_quantization("auto", "cuda", preset_config(preset)).name, "mxfp4") << preset;
}

TEST(Quantization, RefusalsNameTheFlag) {
  for (const std::string requested : {"mxfp4", "mxfp4-fp8"})
    for (const std::string backend : {"cpu", "cuda"}) {
      try {
        resolve_quantization(requested, backend, checkpoint(false));
        ADD_FAILURE() << requested << " on a checkpoint with bf16 experts";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--quantization " + requested + ": the experts of tiny are not MXFP4"),
                  std::string::npos)
            << e.what();
      }
    }
  EXPECT_THROW(resolve_quantization("int4", "cuda", checkpoint(true)), Error);
  RuntimeOptions o;
  o.quantization = "fp16";
  EXPECT_THROW(o.validate(), Error);
  o.quantization = "mxfp4-fp8";
  EXPECT_NO_THROW(o.validate());
}

// Relative L2 of each position's logits against the reference's; the median and the worst.
struct RelL2 {
  double median = 0, worst = 0;
};
RelL2 rel_l2(const std::vector<float>& got, const std::vector<float>& ref, int positions) {
  const size_t V = ref.size() / size_t(positions);
  std::vector<double> r;
  for (int p = 0; p < positions; ++p) {
    double d = 0, n = 0;
    for (size_t v = 0; v < V; ++v) {
      const double a = got[p * V + v], b = ref[p * V + v];
      d += (a - b) * (a - b), n += b * b;
    }
    r.push_back(std::sqrt(d / n));
  }
  std::sort(r.begin(), r.end());
  return {r[r.size() / 2], r.back()};
}

TEST(Quantization, TinyModelOnTheCpuInEveryFormat) {
  const std::vector<int32_t> ids = {1, 200, 3000, 40000, 199000, 17, 5, 88, 1234, 9999, 4, 2};
  auto logits = [&](const std::string& q, std::string* name) {
    RuntimeOptions o;
    o.model = "tiny";
    o.load_format = "dummy";
    o.weights_seed = 3;
    o.threads = 2;
    o.quantization = q;
    o.max_num_batched_tokens = o.max_num_seqs = 16;
    auto rt = ModelRuntime::build(o, ModelRuntime::Parts::ModelOnly);
    *name = rt->quantization().name;
    EXPECT_NE(rt->describe().find("quantization " + *name), std::string::npos) << rt->describe();
    return rt->sequence_logits(ids, 5);
  };
  std::string f32_name, mxfp4_name, fp8_name, mixed_name;
  const std::vector<float> f32 = logits("auto", &f32_name), mxfp4 = logits("mxfp4", &mxfp4_name);
  const std::vector<float> fp8 = logits("fp8", &fp8_name), mixed = logits("mxfp4-fp8", &mixed_name);
  EXPECT_EQ(f32_name, "f32");
  EXPECT_EQ(mxfp4_name, "f32");
  EXPECT_EQ(fp8_name, "fp8");
  EXPECT_EQ(mixed_name, "mxfp4-fp8");
  EXPECT_EQ(mxfp4, f32) << "on the CPU mxfp4 is the reference path";
  const int n = int(ids.size());
  const RelL2 a = rel_l2(fp8, f32, n), b = rel_l2(mixed, f32, n), c = rel_l2(mixed, fp8, n);
  std::printf(
      "[quantization] tiny, relative L2 of the logits per position (median / worst): fp8 vs f32 %.3g / %.3g, "
      "mxfp4-fp8 vs f32 %.3g / %.3g, mxfp4-fp8 vs fp8 %.3g / %.3g\n",
      a.median, a.worst, b.median, b.worst, c.median, c.worst);
  // Random weights are sensitive (issue 15 measured 16-28% for fp8): a visible move, not a broken model.
  EXPECT_GT(a.median, 1e-3);
  EXPECT_LT(a.worst, 1.0);
  EXPECT_GT(b.median, 1e-3);
  EXPECT_LT(b.worst, 1.0);
  EXPECT_GT(c.median, 1e-4) << "fp8 also quantizes the experts";
}

}  // namespace
}  // namespace ossrt
