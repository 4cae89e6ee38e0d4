#include "parallel/rank_threads.h"

#include <utility>

#include "core/error.h"

namespace ossrt {

RankThreads::RankThreads(int ranks) {
  OSSRT_CHECK(ranks >= 1, "rank threads: {} ranks", ranks);
  threads_.reserve(size_t(ranks));
  for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { rank_loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankThreads::run(const Job& job, const OnFailure& on_failure) {
  std::lock_guard one_job(run_mu_);
  std::unique_lock lock(mu_);
  job_ = &job;
  on_failure_ = &on_failure;
  first_error_ = nullptr;
  running_ = size();
  ++generation_;
  start_cv_.notify_all();
  done_cv_.wait(lock, [&] { return running_ == 0; });
  job_ = nullptr;
  on_failure_ = nullptr;
  if (first_error_) std::rethrow_exception(std::exchange(first_error_, nullptr));
}

void RankThreads::rank_loop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const Job* job = nullptr;
    const OnFailure* on_failure = nullptr;
    {
      std::unique_lock lock(mu_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      on_failure = on_failure_;
    }
    std::exception_ptr error;
    std::string what;
    try {
      (*job)(rank);
    } catch (const std::exception& e) {
      error = std::current_exception();
      what = e.what();
    } catch (...) {
      error = std::current_exception();
      what = "unknown exception";
    }
    if (error) {
      {
        std::lock_guard lock(mu_);
        if (!first_error_) first_error_ = error;
      }
      if (*on_failure) (*on_failure)(rank, what);
    }
    {
      std::lock_guard lock(mu_);
      --running_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace ossrt
