#pragma once
// A small Prometheus registry (text exposition format 0.0.4) for the server's metrics. The names
// are vLLM's (docs/reference/SERVING.md 6) because dashboards and autoscalers key on them unchanged.
// Thread-safe: request threads update, the /metrics handler renders.
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ossrt::server {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { Counter, Gauge, Histogram };

class MetricsRegistry {
 public:
  // Declares a family once (help text, type, histogram bucket upper bounds in ascending order).
  // Declaring twice keeps the first declaration.
  void declare(const std::string& name, MetricType type, const std::string& help, std::vector<double> buckets = {});

  // Updates; the family must be declared (an undeclared name is a programming error and throws).
  void add(const std::string& name, const MetricLabels& labels, double delta = 1.0);
  void set(const std::string& name, const MetricLabels& labels, double value);
  void observe(const std::string& name, const MetricLabels& labels, double value);

  // Current value of a counter/gauge sample (0 when never touched); for tests and self-checks.
  double value(const std::string& name, const MetricLabels& labels) const;
  // Number of observations of a histogram sample.
  uint64_t count(const std::string& name, const MetricLabels& labels) const;

  std::string render() const;

 private:
  struct Sample {
    double value = 0.0;                 // counter/gauge value, histogram sum
    uint64_t count = 0;                 // histogram observations
    std::vector<uint64_t> bucket_hits;  // histogram, per bucket (not cumulative)
  };
  struct Family {
    MetricType type;
    std::string help;
    std::vector<double> buckets;
    std::map<MetricLabels, Sample> samples;
  };
  Family& family(const std::string& name, MetricType expected);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

// Label values escaped for the exposition format (backslash, double quote, newline).
std::string escape_label_value(const std::string& v);

}  // namespace ossrt::server
