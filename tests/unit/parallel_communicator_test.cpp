// The in-process communicator against plain loops over the ranks' inputs, for 1..8 ranks: values,
// the rank-order summation (bitwise), refusal of uneven sizes and of non-F32 tensors, and abort.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/in_process_communicator.h"

namespace ossrt {
namespace {

Tensor view(std::vector<float>& v) { return Tensor(v.data(), DType::F32, {int64_t(v.size())}); }

// Per-rank random inputs whose sums depend on the order they are added in (mixed magnitudes).
std::vector<std::vector<float>> random_inputs(int ranks, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<std::vector<float>> in(static_cast<size_t>(ranks), std::vector<float>(n));
  for (auto& v : in)
    for (auto& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
  return in;
}

// Runs fn(rank, comm) on one thread per rank; returns how many ranks threw ossrt::Error.
int run_ranks(InProcessGroup& group, const std::function<void(int, Communicator&)>& fn) {
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r)
    threads.emplace_back([&, r] {
      auto comm = group.communicator(r);
      try {
        fn(r, *comm);
      } catch (const Error&) {
        ++errors;
        group.abort("test rank failed");
      }
    });
  for (auto& t : threads) t.join();
  return errors.load();
}

class CommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(CommunicatorTest, AllReduceSumsInRankOrderOnEveryRank) {
  const int ranks = GetParam();
  const size_t n = 1001;  // not a multiple of the rank count: the per-rank slices are uneven
  const auto in = random_inputs(ranks, n, 1);
  std::vector<float> expected(n);
  for (size_t i = 0; i < n; ++i) {
    float acc = in[0][i];
    for (int r = 1; r < ranks; ++r) acc += in[size_t(r)][i];
    expected[i] = acc;
  }
  auto data = in;
  auto group = InProcessGroup::create(ranks);
  ASSERT_EQ(run_ranks(*group,
                      [&](int r, Communicator& c) {
                        EXPECT_EQ(c.rank(), r);
                        EXPECT_EQ(c.size(), ranks);
                        Tensor t = view(data[size_t(r)]);
                        c.all_reduce_sum(t);
                      }),
            0);
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(data[size_t(r)][i], expected[i]) << "rank " << r << " element " << i;
}

TEST_P(CommunicatorTest, AllGatherConcatenatesInRankOrder) {
  const int ranks = GetParam();
  const size_t n = 37;
  auto in = random_inputs(ranks, n, 2);
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks), std::vector<float>(n * size_t(ranks)));
  auto group = InProcessGroup::create(ranks);
  ASSERT_EQ(run_ranks(*group,
                      [&](int r, Communicator& c) {
                        Tensor o = view(out[size_t(r)]);
                        c.all_gather(view(in[size_t(r)]), o);
                      }),
            0);
  for (int r = 0; r < ranks; ++r)
    for (int j = 0; j < ranks; ++j)
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[size_t(r)][size_t(j) * n + i], in[size_t(j)][i]);
}

TEST_P(CommunicatorTest, AllGatherColumnsPlacesEachRanksColumnsSideBySide) {
  const int ranks = GetParam();
  const int64_t rows = 5, cols = 7;
  auto in = random_inputs(ranks, size_t(rows * cols), 3);
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks), std::vector<float>(size_t(rows * cols * ranks)));
  auto group = InProcessGroup::create(ranks);
  ASSERT_EQ(run_ranks(*group,
                      [&](int r, Communicator& c) {
                        Tensor i(in[size_t(r)].data(), DType::F32, {rows, cols});
                        Tensor o(out[size_t(r)].data(), DType::F32, {rows, cols * ranks});
                        c.all_gather_columns(i, o);
                      }),
            0);
  for (int r = 0; r < ranks; ++r)
    for (int64_t row = 0; row < rows; ++row)
      for (int j = 0; j < ranks; ++j)
        for (int64_t col = 0; col < cols; ++col)
          ASSERT_EQ(out[size_t(r)][size_t(row * cols * ranks + j * cols + col)],
                    in[size_t(j)][size_t(row * cols + col)]);
}

TEST_P(CommunicatorTest, ReduceScatterGivesEachRankTheSumOfItsChunk) {
  const int ranks = GetParam();
  const size_t n = 29;
  auto in = random_inputs(ranks, n * size_t(ranks), 4);
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks), std::vector<float>(n));
  auto group = InProcessGroup::create(ranks);
  ASSERT_EQ(run_ranks(*group,
                      [&](int r, Communicator& c) {
                        Tensor o = view(out[size_t(r)]);
                        c.reduce_scatter_sum(view(in[size_t(r)]), o);
                      }),
            0);
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < n; ++i) {
      float acc = in[0][size_t(r) * n + i];
      for (int j = 1; j < ranks; ++j) acc += in[size_t(j)][size_t(r) * n + i];
      ASSERT_EQ(out[size_t(r)][i], acc) << "rank " << r << " element " << i;
    }
}

TEST_P(CommunicatorTest, AllToAllTransposesChunks) {
  const int ranks = GetParam();
  const size_t n = 11;
  auto in = random_inputs(ranks, n * size_t(ranks), 5);
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks), std::vector<float>(n * size_t(ranks)));
  auto group = InProcessGroup::create(ranks);
  ASSERT_EQ(run_ranks(*group,
                      [&](int r, Communicator& c) {
                        Tensor o = view(out[size_t(r)]);
                        c.all_to_all(view(in[size_t(r)]), o);
                      }),
            0);
  for (int r = 0; r < ranks; ++r)
    for (int j = 0; j < ranks; ++j)
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[size_t(r)][size_t(j) * n + i], in[size_t(j)][size_t(r) * n + i]);
}

TEST_P(CommunicatorTest, ManyCollectivesInARowStayInStep) {
  // Reuse of the same group: 200 all-reduces of a rank-dependent value, each checked on every rank.
  const int ranks = GetParam();
  auto group = InProcessGroup::create(ranks);
  std::atomic<int> wrong{0};
  ASSERT_EQ(run_ranks(*group,
                      [&](int r, Communicator& c) {
                        std::vector<float> v(3);
                        for (int step = 0; step < 200; ++step) {
                          std::fill(v.begin(), v.end(), float(r + step));
                          Tensor t = view(v);
                          c.all_reduce_sum(t);
                          const float expected = float(ranks * (ranks - 1) / 2 + ranks * step);
                          if (v[0] != expected || v[2] != expected) ++wrong;
                          if (step % 50 == 0) c.barrier();
                        }
                      }),
            0);
  EXPECT_EQ(wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommunicatorTest, ::testing::Range(1, 9));

TEST(CommunicatorErrors, UnevenSizesAreRefusedOnEveryRank) {
  for (int ranks : {2, 3, 8}) {
    auto group = InProcessGroup::create(ranks);
    // Rank 1 gathers one element more than the others: every rank sees the mismatch and throws.
    const int errors = run_ranks(*group, [&](int r, Communicator& c) {
      std::vector<float> in(size_t(4 + (r == 1)), 1.0f), out(in.size() * size_t(ranks));
      Tensor o = view(out);
      c.all_gather(view(in), o);
    });
    EXPECT_EQ(errors, ranks) << ranks << " ranks";
  }
  auto group = InProcessGroup::create(2);
  EXPECT_EQ(run_ranks(*group,
                      [&](int r, Communicator& c) {
                        std::vector<float> v(size_t(10 + r));
                        Tensor t = view(v);
                        c.all_reduce_sum(t);
                      }),
            2);
}

TEST(CommunicatorErrors, MismatchedOperationsAreRefused) {
  auto group = InProcessGroup::create(2);
  EXPECT_EQ(run_ranks(*group,
                      [&](int r, Communicator& c) {
                        std::vector<float> v(4), out(8);
                        Tensor t = view(v), o = view(out);
                        if (r == 0)
                          c.all_reduce_sum(t);
                        else
                          c.all_gather(t, o);
                      }),
            2);
}

TEST(CommunicatorErrors, WrongShapesAndDtypesAreRefusedBeforeTheRendezvous) {
  auto group = InProcessGroup::create(1);
  auto c = group->communicator(0);
  std::vector<float> v(4), out(3);
  Tensor o = view(out);
  EXPECT_THROW(c->all_gather(view(v), o), Error);          // out must hold size x in
  EXPECT_THROW(c->reduce_scatter_sum(view(v), o), Error);  // in must hold size x out
  std::vector<uint16_t> half(4);
  Tensor bf16(half.data(), DType::BF16, {4});
  EXPECT_THROW(c->all_reduce_sum(bf16), Error);
  Tensor gpu = view(v);
  gpu.device = Device::CUDA;
  EXPECT_THROW(c->all_reduce_sum(gpu), Error);
  EXPECT_THROW(group->communicator(1), Error);
  EXPECT_THROW(InProcessGroup::create(0), Error);
}

TEST(CommunicatorErrors, AbortWakesRanksWaitingForAFailedPeerAndResetRecovers) {
  auto group = InProcessGroup::create(4);
  // Rank 3 fails before the collective; the other three would wait forever without abort.
  const int errors = run_ranks(*group, [&](int r, Communicator& c) {
    if (r == 3) throw Error("rank 3 broke");
    std::vector<float> v(8, 1.0f);
    Tensor t = view(v);
    c.all_reduce_sum(t);
  });
  EXPECT_EQ(errors, 4);
  group->reset();
  std::vector<std::vector<float>> data(4, std::vector<float>(8, 1.0f));
  EXPECT_EQ(run_ranks(*group,
                      [&](int r, Communicator& c) {
                        Tensor t = view(data[size_t(r)]);
                        c.all_reduce_sum(t);
                      }),
            0);
  EXPECT_EQ(data[2][5], 4.0f);
}

}  // namespace
}  // namespace ossrt
