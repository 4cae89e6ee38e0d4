#include "engine/step_phases.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

namespace ossrt {

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::Inbox: return "inbox";
    case StepPhase::Drafts: return "drafts";
    case StepPhase::Schedule: return "schedule";
    case StepPhase::Plan: return "plan";
    case StepPhase::Masks: return "masks";
    case StepPhase::Forward: return "forward";
    case StepPhase::Deliver: return "deliver";
    case StepPhase::MaskWait: return "mask_wait";
    case StepPhase::Sample: return "sample";
    case StepPhase::Emit: return "emit";
    case StepPhase::Observe: return "observe";
    case StepPhase::Stats: return "stats";
    case StepPhase::Count: break;
  }
  return "?";
}

bool StepPhaseTimer::enabled_by_environment() {
  const char* v = std::getenv("OSSRT_ENGINE_STEP_TIMING");
  return v && std::strcmp(v, "0") != 0 && *v != '\0';
}

std::vector<std::pair<std::string, double>> EngineStepTiming::per_phase_us() const {
  int steps = 0;
  std::array<double, size_t(StepPhase::Count)> sum{};
  for (const auto& [batch, s] : by_batch) {
    steps += s.steps;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += s.us[i];
  }
  std::vector<std::pair<std::string, double>> out;
  double total = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    const double us = steps ? sum[i] / steps : 0.0;
    out.emplace_back(step_phase_name(StepPhase(i)), us);
    total += us;
  }
  out.emplace_back("total", total);
  return out;
}

std::string EngineStepTiming::table() const {
  std::string out = "engine step timing (decode steps, us per step):";
  for (const auto& [batch, s] : by_batch) {
    out += fmt::format("\n  batch {:4} ({} steps):", batch, s.steps);
    for (size_t i = 0; i < s.us.size(); ++i)
      out += fmt::format(" {} {:.1f}", step_phase_name(StepPhase(i)), s.us[i] / s.steps);
  }
  return out;
}

}  // namespace ossrt
