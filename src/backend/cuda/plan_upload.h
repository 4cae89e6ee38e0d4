#pragma once
// StepPlan upload: the plan's arrays go once per step into fixed device buffers (fixed so a CUDA
// graph captured for a decode bucket reads the same addresses when replayed), through a pinned
// staging copy and one cudaMemcpyAsync per array. The plan is validated on the host first, so no
// kernel ever indexes with a token id, slot or block id out of range.
#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels/device_plan.cuh"

struct CUstream_st;
struct CUevent_st;

namespace ossrt::cuda {

class DeviceBuffers;

struct PlanCapacity {
  int max_tokens = 8192;
  int max_seqs = 256;
  int64_t max_table_entries = 1 << 20;  // per group
};

// Throws ossrt::Error describing the first inconsistency: array sizes, SeqStep ranges, slots and
// table entries outside the KV pools (when `kv` is given), capacities.
void validate_step_plan(const StepPlan& plan, const PlanCapacity& capacity, const KvCacheShape* kv);

class StepPlanUploader {
 public:
  StepPlanUploader(DeviceBuffers& buffers, const PlanCapacity& capacity);
  ~StepPlanUploader();

  // Copies the (validated) plan into the device buffers on `stream` and returns the DevicePlan.
  // With copy == false only the host scalars are refreshed (used while capturing a graph: the data
  // was uploaded just before capture and is re-uploaded before every replay).
  const DevicePlan& upload(const StepPlan& plan, CUstream_st* stream, bool copy = true);
  const DevicePlan& device_plan() const { return plan_; }
  const StepPlan& host_plan() const { return host_; }
  const PlanCapacity& capacity() const { return capacity_; }
  // Overrides DevicePlan::max_context (an upper bound is allowed): graphs are captured for a
  // context bucket so the decode split count baked into them holds for every replay.
  void set_max_context_override(std::optional<int> value) { max_context_override_ = value; }

 private:
  PlanCapacity capacity_;
  DevicePlan plan_;
  StepPlan host_;
  std::vector<SeqStep> token_seqs_;  // staging of DevicePlan::token_seqs
  char* device_ = nullptr;
  char* staging_ = nullptr;
  CUevent_st* copied_ = nullptr;  // recorded after the last upload: staging may be reused after it
  std::optional<int> max_context_override_;
};

}  // namespace ossrt::cuda
