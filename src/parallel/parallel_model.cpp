// ParallelModel: ranks as threads, one backend and one sharded GptOssModel each. The communicators
// follow the rank layout of ParallelConfig (parallel_config.h): tp groups of consecutive ranks, dp
// groups of ranks with the same tp rank, and the MoE over the whole world. Each rank's work runs on
// its own long-lived thread (RankThreads), which its backend binds to the rank's device.
#include "parallel/parallel_model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "backend/registry/registry.h"
#include "core/error.h"
#include "parallel/in_process_communicator.h"
#include "parallel/rank_threads.h"
#ifdef OSSRT_WITH_NCCL
#include "parallel/nccl/nccl_communicator.h"
#endif

namespace ossrt {

struct ParallelModel::Rank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> tp, dp, moe;
  ModelShard shard;
  std::unique_ptr<GptOssModel> model;
  Tensor logits;  // the last step's, on the rank's device
};

namespace {
// Members of each group as rank lists: the in-process and NCCL factories build the same groups.
std::vector<std::vector<int>> tp_groups(const ParallelConfig& p) {
  std::vector<std::vector<int>> groups;
  for (int first = 0; first < p.world_size(); first += p.tensor_parallel) {
    groups.emplace_back();
    for (int t = 0; t < p.tensor_parallel; ++t) groups.back().push_back(first + t);
  }
  return groups;
}
std::vector<std::vector<int>> dp_groups(const ParallelConfig& p) {
  std::vector<std::vector<int>> groups;
  for (int t = 0; t < p.tensor_parallel; ++t) {
    groups.emplace_back();
    for (int d = 0; d < p.data_parallel; ++d) groups.back().push_back(d * p.tensor_parallel + t);
  }
  return groups;
}
}  // namespace

ParallelModel::ParallelModel(const HostModelWeights& host, const ParallelConfig& parallel,
                             const std::string& backend_name, const BackendOptions& options, const ModelLimits& limits)
    : config_(host.config), limits_(limits), parallel_(parallel) {
  parallel.validate(host.config);
  const int world = parallel.world_size();
#ifdef OSSRT_WITH_NCCL
  if (backend_name == "cuda")
    OSSRT_CHECK(world <= cuda_device_count(), "{} needs {} GPUs (one per rank), {} visible", parallel.describe(), world,
                cuda_device_count());
#else
  OSSRT_CHECK(backend_name == "cpu" || world == 1,
              "{} on --backend {}: this build has no NCCL communicator; sharded runs need --backend cpu",
              parallel.describe(), backend_name);
#endif
  for (int r = 0; r < world; ++r) {
    ranks_.push_back(std::make_unique<Rank>());
    ranks_.back()->shard = parallel.shard_of(r);
  }
  // One rank runs on the caller's thread; more get a thread each for the life of the model.
  if (world > 1) threads_ = std::make_unique<RankThreads>(world);
  // Each rank's backend is made on the rank's own thread: a CUDA backend's constructor makes its
  // device (rank r: options.device_index + r) current there, which binds the thread to it.
  run_on_ranks([&](int r) {
    BackendOptions o = options;
    o.device_index = options.device_index + r;
    if (backend_name == "cpu") {
      const int cores = options.threads > 0 ? options.threads : int(std::max(1u, std::thread::hardware_concurrency()));
      o.threads = std::max(1, cores / world);
    }
    ranks_[size_t(r)]->backend = make_backend(backend_name, o);
  });
  if (world > 1) make_communicators();
  // Uploads in parallel: each rank converts its own slice.
  run_on_ranks([&](int r) {
    Rank& rank = *ranks_[size_t(r)];
    ModelShard shard = rank.shard;
    shard.tp = rank.tp.get(), shard.dp = rank.dp.get(), shard.moe = rank.moe.get();
    rank.model = std::make_unique<GptOssModel>(*rank.backend, host, limits, shard);
  });
  spdlog::info("parallel: {} on {}", parallel.describe(), backend_name);
}

ParallelModel::~ParallelModel() = default;

void ParallelModel::make_communicators() {
  const int world = parallel_.world_size();
  const bool need_dp = parallel_.data_parallel > 1;
  // Host backends' ranks share memory and meet in it; device backends' ranks meet through NCCL on
  // their devices' queues.
  if (ranks_[0]->backend->device_queue().device < 0) {
    auto world_group = InProcessGroup::create(world);
    groups_.push_back(world_group);
    for (int r = 0; r < world; ++r) ranks_[size_t(r)]->moe = world_group->communicator(r);
    for (const auto& members : tp_groups(parallel_)) {
      auto g = InProcessGroup::create(int(members.size()));
      groups_.push_back(g);
      for (size_t i = 0; i < members.size(); ++i) ranks_[size_t(members[i])]->tp = g->communicator(int(i));
    }
    if (need_dp)
      for (const auto& members : dp_groups(parallel_)) {
        auto g = InProcessGroup::create(int(members.size()));
        groups_.push_back(g);
        for (size_t i = 0; i < members.size(); ++i) ranks_[size_t(members[i])]->dp = g->communicator(int(i));
      }
    return;
  }
#ifdef OSSRT_WITH_NCCL
  // One NCCL clique per group, over the group's devices, each on its rank's backend queue.
  auto make_group = [&](const std::vector<int>& members, size_t gather_bytes, auto slot) {
    std::vector<Backend::DeviceQueue> queues;
    for (int r : members) queues.push_back(ranks_[size_t(r)]->backend->device_queue());
    auto comms = make_nccl_communicators(queues, gather_bytes);
    for (size_t i = 0; i < members.size(); ++i) (ranks_[size_t(members[i])].get()->*slot) = std::move(comms[i]);
  };
  std::vector<int> all(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) all[size_t(r)] = r;
  make_group(all, 0, &Rank::moe);
  const size_t logits_bytes = size_t(limits_.max_logit_rows) * size_t(config_.vocab_size) * sizeof(float);
  for (const auto& members : tp_groups(parallel_)) make_group(members, logits_bytes, &Rank::tp);
  if (need_dp)
    for (const auto& members : dp_groups(parallel_)) make_group(members, 0, &Rank::dp);
#else
  fail("parallel: no communicator for backend '{}' in this build (device ranks need NCCL)", ranks_[0]->backend->name());
#endif
}

GptOssModel& ParallelModel::rank_model(int rank) {
  OSSRT_CHECK(rank >= 0 && rank < world_size(), "rank {} outside {}", rank, world_size());
  return *ranks_[size_t(rank)]->model;
}

Backend& ParallelModel::rank_backend(int rank) {
  OSSRT_CHECK(rank >= 0 && rank < world_size(), "rank {} outside {}", rank, world_size());
  return *ranks_[size_t(rank)]->backend;
}

void ParallelModel::allocate_kv_cache(const KvCacheShape& shape) {
  OSSRT_CHECK(shape.num_kv_heads == config_.num_key_value_heads,
              "parallel: KV cache shape for {} KV heads, the model has {}", shape.num_kv_heads,
              config_.num_key_value_heads);
  run_on_ranks([&](int r) {
    Rank& rank = *ranks_[size_t(r)];
    KvCacheShape local = shape;
    local.num_kv_heads = rank.model->local_kv_heads();
    rank.backend->allocate_kv_cache(local);
  });
}

int ParallelModel::local_kv_heads() const { return ranks_[0]->model->local_kv_heads(); }

Tensor ParallelModel::forward_on_rank0(const StepPlan& plan) {
  OSSRT_CHECK(parallel_.data_parallel == 1, "parallel: with data parallelism use forward_dp (one plan per group)");
  run_on_ranks([&](int r) { ranks_[size_t(r)]->logits = ranks_[size_t(r)]->model->forward(plan); });
  return ranks_[0]->logits;
}

std::vector<float> ParallelModel::forward(const StepPlan& plan) {
  const Tensor logits = forward_on_rank0(plan);
  return ranks_[0]->backend->to_host_f32(logits);
}

std::vector<std::vector<float>> ParallelModel::forward_dp(std::span<const StepPlan> plans) {
  const int dp = parallel_.data_parallel;
  OSSRT_CHECK(int(plans.size()) == dp, "parallel: {} plans for {} data-parallel groups", plans.size(), dp);
  run_on_ranks([&](int r) {
    Rank& rank = *ranks_[size_t(r)];
    rank.logits = rank.model->forward(plans[size_t(rank.shard.dp_rank)]);
  });
  std::vector<std::vector<float>> out;
  for (int d = 0; d < dp; ++d) {
    Rank& first = *ranks_[size_t(d * parallel_.tensor_parallel)];
    out.push_back(first.backend->to_host_f32(first.logits));
  }
  return out;
}

void ParallelModel::run_on_ranks(const std::function<void(int rank)>& fn) {
  if (!threads_) return fn(0);
  try {
    // Peers may be waiting inside a collective for a rank that failed: wake them (they throw too).
    threads_->run(fn, [this](int rank, const std::string& what) {
      for (auto& g : groups_) g->abort(fmt::format("rank {} failed: {}", rank, what));
    });
  } catch (...) {
    for (auto& g : groups_) g->reset();  // every rank has returned: the groups are usable again
    throw;
  }
}

}  // namespace ossrt
