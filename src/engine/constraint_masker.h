#pragma once
// Computes the token masks of a step's constrained rows on a helper thread while the engine thread
// runs the model, so that structured outputs add no time to a step whose forward pass is longer
// than its mask work (and no device synchronisation: the mask is applied by the host sampler,
// which already copies those rows). One start()/wait() pair per step.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sampling/token_constraint.h"

namespace ossrt {

struct MaskJob {
  TokenConstraint* constraint = nullptr;
  std::vector<uint32_t>* mask = nullptr;  // resized and zeroed by the masker
  bool* active = nullptr;                 // set: whether the mask restricts anything
  std::string* error = nullptr;           // set when fill_mask threw
};

class ConstraintMasker {
 public:
  ConstraintMasker();
  ~ConstraintMasker();
  ConstraintMasker(const ConstraintMasker&) = delete;
  ConstraintMasker& operator=(const ConstraintMasker&) = delete;

  // Starts the jobs on the helper thread (nothing to do: returns at once).
  void start(std::vector<MaskJob> jobs);
  // Waits for the jobs of the last start().
  void wait();

 private:
  static void run(const MaskJob& job);
  void thread_main();

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<MaskJob> jobs_;
  bool pending_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace ossrt
