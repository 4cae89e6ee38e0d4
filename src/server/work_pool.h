#pragma once
// Where CPU-heavy request work runs: JSON parsing, Harmony rendering, tokenization. Never on the
// HTTP I/O threads, so one client's 30 MB prompt cannot delay /health or another client's stream
// (issue 19: four 30 MB POST /tokenize made GET /health take 17 s). Bounded in threads and in
// queued tasks: when the queue is full, try_post refuses at once and the caller answers 503 with
// Retry-After, instead of letting work (and the request bodies it holds) pile up without limit.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ossrt::server {

class WorkPool {
 public:
  WorkPool(int threads, size_t max_queued);
  ~WorkPool();  // runs what is queued, then joins
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues `task`; false (and `task` dropped unrun) when max_queued tasks already wait.
  // Tasks must not throw (an escaping exception is logged and swallowed).
  bool try_post(std::function<void()> task);
  // Tasks waiting for a thread (not counting the ones running).
  size_t queued() const;
  int threads() const { return int(threads_.size()); }

 private:
  void run();

  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ossrt::server
