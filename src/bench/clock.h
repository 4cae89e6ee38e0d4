#pragma once
// Time as the benchmarks record it: intervals in seconds, and the UTC timestamp a result carries.
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>
#include <string>

namespace ossrt::bench {

// A steady-clock interval in seconds, the unit every latency sample is kept in.
inline double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Now, as "YYYY-MM-DDTHH:MM:SSZ" (a result file's "date").
inline std::string utc_now() {
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}Z",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(std::chrono::system_clock::now())));
}

}  // namespace ossrt::bench
