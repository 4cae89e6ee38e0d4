#include "engine/constraint_masker.h"

#include <algorithm>

namespace ossrt {

ConstraintMasker::ConstraintMasker() : thread_([this] { thread_main(); }) {}

ConstraintMasker::~ConstraintMasker() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ConstraintMasker::run(const MaskJob& job) {
  const size_t words = (size_t(std::max(job.constraint->vocab_size(), 0)) + 31) / 32;
  job.mask->assign(words, 0u);
  try {
    *job.active = job.constraint->fill_mask(*job.mask);
  } catch (const std::exception& e) {
    *job.active = false;
    *job.error = e.what();
  }
}

void ConstraintMasker::start(std::vector<MaskJob> jobs) {
  if (jobs.empty()) return;
  {
    std::lock_guard lk(mu_);
    jobs_ = std::move(jobs);
    pending_ = true;
  }
  cv_.notify_one();
}

void ConstraintMasker::wait() {
  std::unique_lock lk(mu_);
  done_cv_.wait(lk, [&] { return !pending_; });
}

void ConstraintMasker::thread_main() {
  for (;;) {
    std::vector<MaskJob> jobs;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || pending_; });
      if (stop_) return;
      jobs = jobs_;
    }
    for (const MaskJob& job : jobs) run(job);
    {
      std::lock_guard lk(mu_);
      pending_ = false;
    }
    done_cv_.notify_all();
  }
}

}  // namespace ossrt
