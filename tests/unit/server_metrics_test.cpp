// The Prometheus text the server emits: checked against an independent reading of the format
// (cumulative buckets, +Inf = count, escaping), and vLLM's metric names present.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include <map>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "server/metrics.h"
#include "server/server_context.h"

using namespace ossrt::server;

namespace {
// sample line "name{labels} value" -> value, keyed by "name{labels}"
std::map<std::string, double> parse_samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}
}  // namespace

TEST(Metrics, HistogramBucketsAreCumulativeAndInfEqualsCount) {
  MetricsRegistry m;
  m.declare("lat", MetricType::Histogram, "latency", {0.1, 1.0, 10.0});
  const MetricLabels l = {{"model_name", "m"}};
  for (double v : {0.05, 0.1, 0.5, 3.0, 30.0, 30.0}) m.observe("lat", l, v);
  auto s = parse_samples(m.render());
  EXPECT_EQ(s.at(R"(lat_bucket{model_name="m",le="0.1"})"), 2);  // 0.05 and 0.1 (le is inclusive)
  EXPECT_EQ(s.at(R"(lat_bucket{model_name="m",le="1"})"), 3);
  EXPECT_EQ(s.at(R"(lat_bucket{model_name="m",le="10"})"), 4);
  EXPECT_EQ(s.at(R"(lat_bucket{model_name="m",le="+Inf"})"), 6);
  EXPECT_EQ(s.at(R"(lat_count{model_name="m"})"), 6);
  EXPECT_DOUBLE_EQ(s.at(R"(lat_sum{model_name="m"})"), 0.05 + 0.1 + 0.5 + 3.0 + 30.0 + 30.0);
}

TEST(Metrics, CountersGaugesAndEscaping) {
  MetricsRegistry m;
  m.declare("c_total", MetricType::Counter, "a counter");
  m.declare("g", MetricType::Gauge, "a gauge");
  m.add("c_total", {{"k", "a\"b\\c\nd"}}, 2);
  m.add("c_total", {{"k", "a\"b\\c\nd"}}, 3);
  m.set("g", {}, 7);
  m.set("g", {}, 4);
  std::string text = m.render();
  EXPECT_NE(text.find("# TYPE c_total counter"), std::string::npos);
  EXPECT_NE(text.find("# TYPE g gauge"), std::string::npos);
  EXPECT_NE(text.find(R"(c_total{k="a\"b\\c\nd"} 5)"), std::string::npos) << text;
  EXPECT_NE(text.find("\ng 4\n"), std::string::npos) << text;
  EXPECT_THROW(m.add("undeclared", {}), ossrt::Error);
  EXPECT_THROW(m.observe("g", {}, 1.0), ossrt::Error);  // a gauge is not a histogram
}

TEST(Metrics, ServerDeclaresVllmNames) {
  boost::asio::io_context io;
  ServerContext ctx(ServerConfig{}, io);
  refresh_generator_gauges(ctx);
  ctx.metrics.observe("vllm:time_to_first_token_seconds", {{"model_name", "gpt-oss"}}, 0.2);
  std::string text = ctx.metrics.render();
  for (const char* name :
       {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
        "vllm:num_preemptions", "vllm:request_success_total", "http_requests_total"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  EXPECT_NE(text.find(R"(vllm:time_to_first_token_seconds_count{model_name="gpt-oss"} 1)"), std::string::npos);
}
