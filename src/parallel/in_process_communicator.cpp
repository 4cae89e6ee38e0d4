// In-process collectives. Each collective is two barriers: after the first every rank's pointers
// are posted and may be read; between them each rank writes only memory no other rank touches in
// this collective (its own output, or its own element range of an all-reduce); after the second
// nobody reads a peer's buffer any more, so callers may reuse theirs.
#include "parallel/in_process_communicator.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ossrt {

namespace {

const char* op_name(int op) {
  static const char* names[] = {"all_reduce_sum",     "all_gather", "all_gather_columns",
                                "reduce_scatter_sum", "all_to_all", "barrier"};
  return names[op];
}

void expect_cpu_f32(const Tensor& t, const char* op, const char* what) {
  OSSRT_CHECK(t.device == Device::CPU, "{}: {} is not a CPU tensor (the in-process communicator is CPU only)", op,
              what);
  OSSRT_CHECK(t.dtype == DType::F32, "{}: {} has dtype {}, the in-process communicator handles F32", op, what,
              dtype_name(t.dtype));
  OSSRT_CHECK(t.numel() == 0 || t.data != nullptr, "{}: {} has no data", op, what);
}

}  // namespace

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank) : g_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size_; }

  void all_reduce_sum(Tensor& t) override {
    expect_cpu_f32(t, "all_reduce_sum", "tensor");
    run({InProcessGroup::Op::AllReduce, t.ptr<float>(), t.ptr<float>(), t.numel(), t.numel()}, [&] {
      // This rank sums one slice of the elements for everybody (in place, so no rank may read an
      // element another rank already overwrote: the slices are disjoint).
      const int64_t n = t.numel(), size = g_->size_;
      const int64_t begin = n * rank_ / size, end = n * (rank_ + 1) / size;
      std::vector<float> sum(size_t(end - begin));
      for (int64_t i = begin; i < end; ++i) {
        float acc = g_->posts_[0].in[i];
        for (int64_t j = 1; j < size; ++j) acc += g_->posts_[size_t(j)].in[i];
        sum[size_t(i - begin)] = acc;
      }
      for (int64_t j = 0; j < size; ++j) std::copy(sum.begin(), sum.end(), g_->posts_[size_t(j)].out + begin);
    });
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    expect_cpu_f32(in, "all_gather", "in"), expect_cpu_f32(out, "all_gather", "out");
    OSSRT_CHECK(out.numel() == in.numel() * size(), "all_gather: out has {} elements, expected {} ranks x {}",
                out.numel(), size(), in.numel());
    run({InProcessGroup::Op::AllGather, in.ptr<float>(), out.ptr<float>(), in.numel(), out.numel()}, [&] {
      const int64_t n = in.numel();
      for (int j = 0; j < size(); ++j) std::copy_n(g_->posts_[size_t(j)].in, n, out.ptr<float>() + j * n);
    });
  }

  void all_gather_columns(const Tensor& in, Tensor& out) override {
    expect_cpu_f32(in, "all_gather_columns", "in"), expect_cpu_f32(out, "all_gather_columns", "out");
    OSSRT_CHECK(in.ndim == 2 && out.ndim == 2 && out.dim(0) == in.dim(0) && out.dim(1) == in.dim(1) * size(),
                "all_gather_columns: in {} and out {} do not fit [R, C] -> [R, {} x C]", in.shape_str(),
                out.shape_str(), size());
    InProcessGroup::Post post{
        InProcessGroup::Op::AllGatherColumns, in.ptr<float>(), out.ptr<float>(), in.numel(), out.numel(), in.dim(0)};
    run(post, [&] {
      const int64_t rows = in.dim(0), cols = in.dim(1), out_cols = out.dim(1);
      for (int j = 0; j < size(); ++j)
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(g_->posts_[size_t(j)].in + r * cols, cols, out.ptr<float>() + r * out_cols + j * cols);
    });
  }

  void reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    expect_cpu_f32(in, "reduce_scatter_sum", "in"), expect_cpu_f32(out, "reduce_scatter_sum", "out");
    OSSRT_CHECK(in.numel() == out.numel() * size(), "reduce_scatter_sum: in has {} elements, expected {} ranks x {}",
                in.numel(), size(), out.numel());
    run({InProcessGroup::Op::ReduceScatter, in.ptr<float>(), out.ptr<float>(), in.numel(), out.numel()}, [&] {
      const int64_t n = out.numel(), offset = int64_t(rank_) * n;
      for (int64_t i = 0; i < n; ++i) {
        float acc = g_->posts_[0].in[offset + i];
        for (int j = 1; j < size(); ++j) acc += g_->posts_[size_t(j)].in[offset + i];
        out.ptr<float>()[i] = acc;
      }
    });
  }

  void all_to_all(const Tensor& in, Tensor& out) override {
    expect_cpu_f32(in, "all_to_all", "in"), expect_cpu_f32(out, "all_to_all", "out");
    OSSRT_CHECK(in.numel() == out.numel() && in.numel() % size() == 0,
                "all_to_all: in ({}) and out ({}) must hold the same number of elements, a multiple of {} ranks",
                in.numel(), out.numel(), size());
    OSSRT_CHECK(in.data != out.data || in.numel() == 0, "all_to_all: in and out must not alias");
    run({InProcessGroup::Op::AllToAll, in.ptr<float>(), out.ptr<float>(), in.numel(), out.numel()}, [&] {
      const int64_t n = in.numel() / size();
      for (int j = 0; j < size(); ++j)
        std::copy_n(g_->posts_[size_t(j)].in + int64_t(rank_) * n, n, out.ptr<float>() + j * n);
    });
  }

  void barrier() override {
    run({InProcessGroup::Op::Barrier, nullptr, nullptr, 0, 0}, [] {});
  }

 private:
  template <typename Fn>
  void run(const InProcessGroup::Post& post, Fn&& work) {
    g_->posts_[size_t(rank_)] = post;  // own slot: nobody reads it before the barrier
    g_->arrive_and_wait();
    g_->check_posts_agree(rank_);  // every rank sees the same posts, so all throw or none does
    work();
    g_->arrive_and_wait();
  }

  std::shared_ptr<InProcessGroup> g_;
  int rank_;
};

std::shared_ptr<InProcessGroup> InProcessGroup::create(int size) {
  return std::shared_ptr<InProcessGroup>(new InProcessGroup(size));
}

InProcessGroup::InProcessGroup(int size) : size_(size) {
  OSSRT_CHECK(size >= 1, "in-process communicator group of {} ranks", size);
  posts_.resize(size_t(size));
}

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  OSSRT_CHECK(rank >= 0 && rank < size_, "rank {} outside a group of {}", rank, size_);
  return std::make_unique<InProcessCommunicator>(shared_from_this(), rank);
}

void InProcessGroup::abort(const std::string& reason) {
  std::lock_guard lock(mu_);
  if (!aborted_) abort_reason_ = reason;
  aborted_ = true;
  cv_.notify_all();
}

void InProcessGroup::reset() {
  std::lock_guard lock(mu_);
  aborted_ = false;
  abort_reason_.clear();
  arrived_ = 0;
  ++generation_;
}

void InProcessGroup::arrive_and_wait() {
  std::unique_lock lock(mu_);
  OSSRT_CHECK(!aborted_, "collective aborted: {}", abort_reason_);
  const uint64_t generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
  OSSRT_CHECK(generation_ != generation, "collective aborted: {}", abort_reason_);
}

void InProcessGroup::check_posts_agree(int rank) const {
  const Post& first = posts_[0];
  for (int j = 1; j < size_; ++j) {
    const Post& p = posts_[size_t(j)];
    OSSRT_CHECK(p.op == first.op, "collective mismatch: rank 0 called {}, rank {} called {}", op_name(int(first.op)), j,
                op_name(int(p.op)));
    OSSRT_CHECK(p.in_elems == first.in_elems && p.out_elems == first.out_elems && p.rows == first.rows,
                "{}: rank {} passed {} -> {} elements, rank 0 passed {} -> {} (uneven sizes are refused)",
                op_name(int(first.op)), j, p.in_elems, p.out_elems, first.in_elems, first.out_elems);
  }
}

}  // namespace ossrt
