#pragma once
// Ranks as threads of one process, meeting in shared memory: the CPU proof of the sharding
// arithmetic (docs/parallel.md). A group is created once for `size` ranks; each rank thread uses
// its own Communicator handle. Every reduction sums in rank order (rank 0 + rank 1 + ...) whatever
// the thread timing, so results are deterministic and identical on every rank.
//
// Failure: a rank that throws between collectives would leave its peers waiting forever; whoever
// runs the rank threads calls abort() when one fails, which makes every waiting (and later) call
// throw, and reset() once all rank threads have returned to make the group usable again.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/communicator.h"

namespace ossrt {

class InProcessGroup : public std::enable_shared_from_this<InProcessGroup> {
 public:
  // Use create(): handles keep the group alive through a shared_ptr.
  static std::shared_ptr<InProcessGroup> create(int size);
  int size() const { return size_; }
  // The handle of `rank` in [0, size); one thread per handle.
  std::unique_ptr<Communicator> communicator(int rank);

  void abort(const std::string& reason);
  void reset();  // only when no rank thread is inside a call

 private:
  friend class InProcessCommunicator;
  explicit InProcessGroup(int size);

  enum class Op : uint8_t { AllReduce, AllGather, AllGatherColumns, ReduceScatter, AllToAll, Barrier };
  // What each rank posted for the current collective.
  struct Post {
    Op op = Op::Barrier;
    const float* in = nullptr;
    float* out = nullptr;
    int64_t in_elems = 0, out_elems = 0;
    int64_t rows = 0;  // AllGatherColumns: rows of `in` (and of `out`)
  };

  // Blocks until all ranks arrived (a reusable generation barrier); throws if aborted.
  void arrive_and_wait();
  void check_posts_agree(int rank) const;

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<Post> posts_;
};

}  // namespace ossrt
