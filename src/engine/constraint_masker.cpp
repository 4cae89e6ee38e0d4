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
  const size_t rows = job.draft.size() + 1;
  int advanced = 0;  // guesses the constraint accepted, to roll back
  try {
    job.masks->resize(rows);
    job.active->assign(rows, 0);
    for (size_t i = 0; i < rows; ++i) {
      std::vector<uint32_t>& mask = (*job.masks)[i];
      mask.assign(words, 0u);
      (*job.active)[i] = job.constraint->fill_mask(mask) ? 1 : 0;
      if (i + 1 == rows) break;
      const int32_t guess = job.draft[i];
      const bool allowed = !(*job.active)[i] || (guess >= 0 && size_t(guess) / 32 < words &&
                                                 (mask[size_t(guess) / 32] >> (guess % 32) & 1u));
      if (!allowed || !job.constraint->accept(guess)) {
        for (size_t j = i + 1; j < rows; ++j) {
          (*job.masks)[j] = mask;
          (*job.active)[j] = (*job.active)[i];
        }
        break;
      }
      ++advanced;
    }
  } catch (const std::exception& e) {
    // The request ends with this error (emit_token), also when it came from a guessed row's state,
    // which plain decoding might never have reached: constraints do not throw on a reachable state.
    job.active->assign(job.active->size(), 0);
    *job.error = e.what();
  }
  if (advanced > 0) {
    try {
      job.constraint->rollback(advanced);
    } catch (const std::exception& e) {
      if (job.error->empty()) *job.error = std::string("rolling back speculative guesses: ") + e.what();
    }
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
