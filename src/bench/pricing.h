#pragma once
// The seed's cost arithmetic, shared by `bench cost` and `bench serve`: a GPU billed by the hour
// (default $3.00, an H200) turns a throughput into dollars per million tokens.
#include <fmt/format.h>

#include <string>

namespace ossrt::bench {

constexpr double kDefaultUsdPerGpuHour = 3.0;

// $ per million tokens at `tokens_per_s` on `gpus` GPUs billed usd_per_hour each; 0 when nothing
// was produced. At $3.00 and one GPU: 833.3 / tokens per second.
inline double usd_per_million(double usd_per_hour, int gpus, double tokens_per_s) {
  return tokens_per_s > 0 ? usd_per_hour * gpus / 3600.0 / tokens_per_s * 1e6 : 0.0;
}

// "$0.123/M", "$4.56/M", "$789/M": three significant figures where they matter, for plot labels.
inline std::string usd_per_million_label(double usd) {
  if (usd >= 100) return fmt::format("${:.0f}/M", usd);
  if (usd >= 1) return fmt::format("${:.2f}/M", usd);
  return fmt::format("${:.3f}/M", usd);
}

}  // namespace ossrt::bench
