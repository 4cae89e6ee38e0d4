#include "backend/step_plan.h"

#include <algorithm>

namespace ossrt {

int StepPlan::max_context() const {
  int m = 0;
  for (const auto& s : seqs) m = std::max(m, s.context_begin + s.num_tokens);
  return m;
}

bool StepPlan::is_decode_only() const {
  return std::all_of(seqs.begin(), seqs.end(), [](const SeqStep& s) { return s.num_tokens == 1; });
}

}  // namespace ossrt
