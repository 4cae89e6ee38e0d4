#pragma once
// Tests wait for conditions, never for fixed times: a fixed sleep is either too short on a loaded
// CI machine (a flaky failure) or longer than needed everywhere else.
#include <chrono>
#include <thread>

namespace ossrt::testing {

// Polls `condition` until it holds or `timeout` passes; returns its last value.
template <typename Condition>
bool wait_until(Condition condition, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace ossrt::testing
