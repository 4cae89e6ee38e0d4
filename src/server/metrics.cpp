#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ossrt::server {
namespace {

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::Counter: return "counter";
    case MetricType::Gauge: return "gauge";
    case MetricType::Histogram: return "histogram";
  }
  return "untyped";
}

// Prometheus wants Go-style floats: integers without a trailing ".0" are fine, +Inf spelled so.
std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  return fmt::format("{}", v);
}

std::string render_labels(const MetricLabels& labels, const std::string& extra_key = {},
                          const std::string& extra_value = {}) {
  if (labels.empty() && extra_key.empty()) return {};
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += fmt::format("{}=\"{}\"", k, escape_label_value(v));
  }
  if (!extra_key.empty()) {
    if (!first) out += ',';
    out += fmt::format("{}=\"{}\"", extra_key, escape_label_value(extra_value));
  }
  return out + "}";
}

}  // namespace

std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void MetricsRegistry::declare(const std::string& name, MetricType type, const std::string& help,
                              std::vector<double> buckets) {
  std::lock_guard lock(mu_);
  if (families_.count(name)) return;
  OSSRT_CHECK(std::is_sorted(buckets.begin(), buckets.end()), "metric {}: histogram buckets must be ascending", name);
  families_.emplace(name, Family{type, help, std::move(buckets), {}});
}

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, MetricType expected) {
  auto it = families_.find(name);
  OSSRT_CHECK(it != families_.end(), "metric {} used before it was declared", name);
  OSSRT_CHECK(it->second.type == expected, "metric {} used as a {} but declared a {}", name, type_name(expected),
              type_name(it->second.type));
  return it->second;
}

void MetricsRegistry::add(const std::string& name, const MetricLabels& labels, double delta) {
  std::lock_guard lock(mu_);
  auto& f = families_.count(name) && families_.at(name).type == MetricType::Gauge ? family(name, MetricType::Gauge)
                                                                                  : family(name, MetricType::Counter);
  f.samples[labels].value += delta;
}

void MetricsRegistry::set(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard lock(mu_);
  family(name, MetricType::Gauge).samples[labels].value = value;
}

void MetricsRegistry::observe(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard lock(mu_);
  Family& f = family(name, MetricType::Histogram);
  Sample& s = f.samples[labels];
  if (s.bucket_hits.empty()) s.bucket_hits.assign(f.buckets.size(), 0);
  s.value += value;
  s.count += 1;
  // The first bucket whose upper bound holds the value; values above every bound only count in +Inf.
  auto it = std::lower_bound(f.buckets.begin(), f.buckets.end(), value);
  if (it != f.buckets.end()) s.bucket_hits[size_t(it - f.buckets.begin())] += 1;
}

double MetricsRegistry::value(const std::string& name, const MetricLabels& labels) const {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0.0;
  auto s = it->second.samples.find(labels);
  return s == it->second.samples.end() ? 0.0 : s->second.value;
}

uint64_t MetricsRegistry::count(const std::string& name, const MetricLabels& labels) const {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto s = it->second.samples.find(labels);
  return s == it->second.samples.end() ? 0 : s->second.count;
}

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, f.help, name, type_name(f.type));
    for (const auto& [labels, s] : f.samples) {
      if (f.type != MetricType::Histogram) {
        out += fmt::format("{}{} {}\n", name, render_labels(labels), format_number(s.value));
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < f.buckets.size(); ++i) {
        cumulative += s.bucket_hits[i];
        out +=
            fmt::format("{}_bucket{} {}\n", name, render_labels(labels, "le", format_number(f.buckets[i])), cumulative);
      }
      out += fmt::format("{}_bucket{} {}\n", name, render_labels(labels, "le", "+Inf"), s.count);
      out += fmt::format("{}_sum{} {}\n", name, render_labels(labels), format_number(s.value));
      out += fmt::format("{}_count{} {}\n", name, render_labels(labels), s.count);
    }
  }
  return out;
}

}  // namespace ossrt::server
