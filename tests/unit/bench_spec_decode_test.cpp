// `bench serve`'s speculative decoding figures (bench/spec_decode_metrics.h): the vLLM-named
// counters parsed from Prometheus text, ours (no suffix) and vLLM's (_total), summed over label
// sets, and a run's difference with its acceptance rate and mean acceptance length worked by hand.
#include <gtest/gtest.h>

#include "bench/spec_decode_metrics.h"

namespace ossrt::bench {
namespace {

TEST(BenchSpecDecode, ParsesOursAndVllmsCountersSummedOverLabels) {
  const std::string ours =
      "# HELP vllm:spec_decode_num_drafts Verify steps\n"
      "# TYPE vllm:spec_decode_num_drafts counter\n"
      "vllm:spec_decode_num_drafts{model_name=\"gpt-oss\"} 10\n"
      "vllm:spec_decode_num_draft_tokens{model_name=\"gpt-oss\"} 30\n"
      "vllm:spec_decode_num_accepted_tokens{model_name=\"gpt-oss\"} 12\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos{model_name=\"gpt-oss\",position=\"0\"} 7\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos{model_name=\"gpt-oss\",position=\"1\"} 4\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos{model_name=\"gpt-oss\",position=\"2\"} 1\n"
      "vllm:spec_decode_num_drafts_other 99\n"  // another metric sharing the prefix
      "vllm:generation_tokens_total{model_name=\"gpt-oss\"} 500\n";
  const auto c = parse_spec_decode_counters(ours);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->drafts, 10);
  EXPECT_EQ(c->draft_tokens, 30);
  EXPECT_EQ(c->accepted_tokens, 12);
  EXPECT_EQ(c->accepted_per_position, (std::vector<double>{7, 4, 1}));

  const std::string vllm =
      "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 4.0\n"
      "vllm:spec_decode_num_drafts_total{engine=\"1\",model_name=\"m\"} 6.0\n"
      "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 20.0 1700000000000\n"
      "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 9.0\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\",position=\"1\"} 3.0\n";
  const auto v = parse_spec_decode_counters(vllm);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->drafts, 10);
  EXPECT_EQ(v->draft_tokens, 20);
  EXPECT_EQ(v->accepted_tokens, 9);
  EXPECT_EQ(v->accepted_per_position, (std::vector<double>{0, 3}));

  EXPECT_FALSE(parse_spec_decode_counters("vllm:generation_tokens_total 5\n# TYPE x counter\n"));
  EXPECT_FALSE(parse_spec_decode_counters(""));
}

TEST(BenchSpecDecode, ARunIsTheDifferenceWithVllmsAcceptanceLength) {
  SpecDecodeCounters before{10, 30, 12, {7, 4, 1}};
  SpecDecodeCounters after{50, 150, 92, {37, 34, 21}};
  const nlohmann::json j = spec_decode_json(before, after);
  EXPECT_EQ(j["num_drafts"], 40.0);
  EXPECT_EQ(j["num_draft_tokens"], 120.0);
  EXPECT_EQ(j["num_accepted_tokens"], 80.0);
  EXPECT_EQ(j["accepted_per_position"], nlohmann::json({30.0, 30.0, 20.0}));
  EXPECT_DOUBLE_EQ(j["acceptance_rate"].get<double>(), 80.0 / 120.0);
  EXPECT_DOUBLE_EQ(j["mean_acceptance_length"].get<double>(), 1.0 + 80.0 / 40.0);  // 3 tokens per verify step

  // Speculation configured but no step guessed in the run: counts of 0, no rates.
  const nlohmann::json idle = spec_decode_json(after, after);
  EXPECT_EQ(idle["num_drafts"], 0.0);
  EXPECT_TRUE(idle["mean_acceptance_length"].is_null());
  EXPECT_TRUE(idle["acceptance_rate"].is_null());
  // No counters (speculation off, or a server without them): null.
  EXPECT_TRUE(spec_decode_json(std::nullopt, after).is_null());
  EXPECT_TRUE(spec_decode_json(before, std::nullopt).is_null());
}

}  // namespace
}  // namespace ossrt::bench
