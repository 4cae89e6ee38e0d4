#pragma once
// Computes the token masks of a step's constrained rows on a helper thread while the engine thread
// runs the model, so that structured outputs add no time to a step whose forward pass is longer
// than its mask work (and no device synchronisation: the mask is applied by the host sampler,
// which already copies those rows). One start()/wait() pair per step.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "sampling/token_constraint.h"

namespace ossrt {

// One sequence's masks for a step: one per sampled row. Row 0 is the mask after the tokens the
// constraint accepted; with speculative guesses, row i + 1 is the mask after guess i as well (the
// masker advances the constraint through the guesses, then rolls it back: the engine accepts the
// tokens it emits). Rows after a guess the constraint refuses get that guess's row's mask: the
// constrained draw there cannot equal the guess, so verification rejects it and ignores the rows
// after it, which only need some legal mask.
struct MaskJob {
  TokenConstraint* constraint = nullptr;
  std::span<const int32_t> draft;                       // the step's guesses (empty: one row)
  std::vector<std::vector<uint32_t>>* masks = nullptr;  // resized to draft + 1 rows, each zeroed and filled
  std::vector<uint8_t>* active = nullptr;               // per row: whether its mask restricts anything
  std::string* error = nullptr;                         // set when the constraint threw
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
