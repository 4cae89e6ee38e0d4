#pragma once
// One host thread per rank, started once and kept for the life of the ParallelModel (and so of the
// engine that steps it). A rank's work always runs on its own thread: the thread creates the rank's
// backend, which binds it to the rank's device (CUDA: cudaSetDevice in the backend's constructor, and
// again on entry to every backend call made with another device current), and every later step,
// upload and KV allocation of that rank runs there. Starting threads per step would cost a thread
// start per rank per step and would leave each new thread on device 0 until something set it.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ossrt {

class RankThreads {
 public:
  using Job = std::function<void(int rank)>;
  // Called on a failing rank's thread with its rank and the error's message (e.g. to wake the peers
  // waiting for it inside a collective), before the job's other ranks are waited for.
  using OnFailure = std::function<void(int rank, const std::string& what)>;

  explicit RankThreads(int ranks);
  ~RankThreads();  // stops and joins the threads (no job may be running)
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return int(threads_.size()); }

  // Runs job(r) on rank r's thread for every rank and returns when all have returned. When some
  // throw, on_failure runs for each of them, and the first exception is rethrown here once every rank
  // has returned. One job at a time (calls from several threads are serialized).
  void run(const Job& job, const OnFailure& on_failure = {});

 private:
  void rank_loop(int rank);

  std::mutex run_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const Job* job_ = nullptr;
  const OnFailure* on_failure_ = nullptr;
  uint64_t generation_ = 0;  // bumped per job; a rank runs each generation once
  int running_ = 0;          // ranks still in the current job
  bool stopping_ = false;
  std::exception_ptr first_error_;
  std::vector<std::thread> threads_;
};

}  // namespace ossrt
