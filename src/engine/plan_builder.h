#pragma once
// Builds the step's StepPlan from the scheduler's choice and the KV block accounting.
#include <vector>

#include "backend/step_plan.h"
#include "engine/scheduler.h"
#include "kvcache/kv_cache.h"

namespace ossrt {

// Rows of plan.logit_rows follow the order of the sampling sequences in `scheduled`.
StepPlan build_step_plan(const std::vector<ScheduledSequence>& scheduled, const KvCache& kv);

}  // namespace ossrt
