#include "backend/cuda/plan_upload.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffers.h"

namespace ossrt::cuda {
namespace {

// Byte offsets of each array inside the one device (and staging) block.
struct Layout {
  size_t token_ids, positions, token_seq, full_slots, window_slots, logit_rows, seqs, token_seqs, full_table,
      window_table, real_tokens, total;
};

Layout layout_for(const PlanCapacity& c) {
  auto round = [](size_t b) { return (b + 255) / 256 * 256; };
  Layout l{};
  size_t off = 0;
  const size_t tok = round(size_t(c.max_tokens) * 4);
  l.token_ids = off, off += tok;
  l.positions = off, off += tok;
  l.token_seq = off, off += tok;
  l.full_slots = off, off += tok;
  l.window_slots = off, off += tok;
  l.logit_rows = off, off += tok;
  l.seqs = off, off += round(size_t(c.max_seqs) * sizeof(SeqStep));
  l.token_seqs = off, off += round(size_t(c.max_tokens) * sizeof(SeqStep));
  l.full_table = off, off += round(size_t(c.max_table_entries) * 4);
  l.window_table = off, off += round(size_t(c.max_table_entries) * 4);
  l.real_tokens = off, off += round(4);
  l.total = off;
  return l;
}

}  // namespace

void validate_step_plan(const StepPlan& p, const PlanCapacity& cap, const KvCacheShape* kv) {
  const size_t t = p.token_ids.size();
  OSSRT_CHECK(
      p.positions.size() == t && p.token_seq.size() == t && p.full_slots.size() == t && p.window_slots.size() == t,
      "step plan: token arrays differ in length (ids {}, positions {}, token_seq {}, full_slots {}, "
      "window_slots {})",
      t, p.positions.size(), p.token_seq.size(), p.full_slots.size(), p.window_slots.size());
  OSSRT_CHECK(int64_t(t) <= cap.max_tokens, "step plan: {} tokens exceed the planned capacity of {} (max_step_tokens)",
              t, cap.max_tokens);
  OSSRT_CHECK(int64_t(p.seqs.size()) <= cap.max_seqs,
              "step plan: {} sequences exceed the planned capacity of {} (max_seqs)", p.seqs.size(), cap.max_seqs);
  OSSRT_CHECK(int64_t(p.full_block_table.size()) <= cap.max_table_entries &&
                  int64_t(p.window_block_table.size()) <= cap.max_table_entries,
              "step plan: block tables ({} / {} entries) exceed the planned capacity of {}", p.full_block_table.size(),
              p.window_block_table.size(), cap.max_table_entries);
  OSSRT_CHECK(p.logit_rows.size() <= t, "step plan: {} logit rows for {} tokens", p.logit_rows.size(), t);
  OSSRT_CHECK(p.padding_tokens >= 0 && size_t(p.padding_tokens) <= t, "step plan: {} padding rows of {} tokens",
              p.padding_tokens, t);
  for (int32_t r : p.logit_rows)
    OSSRT_CHECK(r >= 0 && size_t(r) < t, "step plan: logit row {} out of range [0, {})", r, t);
  OSSRT_CHECK(p.block_size > 0, "step plan: block_size {}", p.block_size);
  if (kv)
    OSSRT_CHECK(p.block_size == kv->block_size, "step plan: block_size {} != KV cache block_size {}", p.block_size,
                kv->block_size);
  const int64_t bs = p.block_size;
  // Tokens of sequence s occupy rows [token_begin, token_begin + num_tokens) and have positions
  // context_begin + i: the attention kernels rely on both.
  for (size_t s = 0; s < p.seqs.size(); ++s) {
    const SeqStep& q = p.seqs[s];
    OSSRT_CHECK(q.num_tokens >= 1 && q.token_begin >= 0 && size_t(q.token_begin) + size_t(q.num_tokens) <= t &&
                    q.context_begin >= 0,
                "step plan: sequence {} has rows [{}, +{}) / context {} outside the {} tokens", s, q.token_begin,
                q.num_tokens, q.context_begin, t);
    const int64_t end = int64_t(q.context_begin) + q.num_tokens;
    const int64_t full_needed = (end + bs - 1) / bs;
    OSSRT_CHECK(q.full_table_begin >= 0 && q.full_table_len >= full_needed &&
                    size_t(q.full_table_begin) + size_t(q.full_table_len) <= p.full_block_table.size(),
                "step plan: sequence {} full table [{}, +{}) must cover {} blocks within {} entries", s,
                q.full_table_begin, q.full_table_len, full_needed, p.full_block_table.size());
    const int64_t last_block = (end - 1) / bs;
    // A cache without window layers (the EAGLE-3 head's one full layer) has no window table to check.
    const bool has_window_layers = !kv || kv->num_sliding_layers > 0;
    OSSRT_CHECK(!has_window_layers ||
                    (q.window_table_begin >= 0 && q.window_first_block >= 0 && q.window_first_block <= last_block &&
                     int64_t(q.window_first_block) + q.window_table_len > last_block &&
                     size_t(q.window_table_begin) + size_t(q.window_table_len) <= p.window_block_table.size()),
                "step plan: sequence {} window table [{}, +{}) from block {} must reach block {} within {} entries", s,
                q.window_table_begin, q.window_table_len, q.window_first_block, last_block,
                p.window_block_table.size());
    for (int i = 0; i < q.num_tokens; ++i) {
      const size_t row = size_t(q.token_begin + i);
      OSSRT_CHECK(p.token_seq[row] == int32_t(s) && p.positions[row] == q.context_begin + i,
                  "step plan: row {} has seq {} position {}, expected seq {} position {}", row, p.token_seq[row],
                  p.positions[row], s, q.context_begin + i);
    }
  }
  if (!kv) return;
  auto check_pool = [&](const std::vector<int32_t>& table, const std::vector<int32_t>& slots, int blocks,
                        const char* group) {
    for (int32_t b : table)
      OSSRT_CHECK(b >= 0 && b < blocks, "step plan: {} block id {} outside the pool of {} blocks", group, b, blocks);
    for (int32_t s : slots)
      OSSRT_CHECK(s >= 0 && int64_t(s) < int64_t(blocks) * bs, "step plan: {} slot {} outside the pool of {} slots",
                  group, s, int64_t(blocks) * bs);
  };
  if (kv->num_full_layers > 0) check_pool(p.full_block_table, p.full_slots, kv->num_full_blocks, "full");
  if (kv->num_sliding_layers > 0) check_pool(p.window_block_table, p.window_slots, kv->num_window_blocks, "window");
}

StepPlanUploader::StepPlanUploader(DeviceBuffers& buffers, const PlanCapacity& capacity) : capacity_(capacity) {
  const Layout l = layout_for(capacity_);
  device_ = static_cast<char*>(buffers.allocate(l.total, "step plan buffers", nullptr));
  staging_ = static_cast<char*>(buffers.allocate_pinned(l.total, "step plan staging"));
  OSSRT_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  auto i32 = [&](size_t off) { return reinterpret_cast<const int32_t*>(device_ + off); };
  plan_.token_ids = i32(l.token_ids);
  plan_.positions = i32(l.positions);
  plan_.token_seq = i32(l.token_seq);
  plan_.full_slots = i32(l.full_slots);
  plan_.window_slots = i32(l.window_slots);
  plan_.logit_rows = i32(l.logit_rows);
  plan_.seqs = reinterpret_cast<const SeqStep*>(device_ + l.seqs);
  plan_.token_seqs = reinterpret_cast<const SeqStep*>(device_ + l.token_seqs);
  plan_.full_block_table = i32(l.full_table);
  plan_.window_block_table = i32(l.window_table);
  plan_.real_tokens = i32(l.real_tokens);
}

StepPlanUploader::~StepPlanUploader() {
  if (copied_) cudaEventDestroy(copied_);
}

const DevicePlan& StepPlanUploader::upload(const StepPlan& p, CUstream_st* stream, bool copy) {
  host_ = p;
  plan_.num_tokens = p.num_tokens();
  plan_.num_seqs = p.num_seqs();
  plan_.block_size = p.block_size;
  plan_.max_context = max_context_override_ ? std::max(*max_context_override_, p.max_context()) : p.max_context();
  plan_.max_seq_tokens = 0;
  for (const auto& s : p.seqs) plan_.max_seq_tokens = std::max(plan_.max_seq_tokens, s.num_tokens);
  plan_.num_logit_rows = int(p.logit_rows.size());
  const bool token_seqs = plan_.max_seq_tokens > 1 && plan_.max_seq_tokens <= kTokenSeqsMaxTokens;
  plan_.num_token_seqs = token_seqs ? plan_.num_tokens : 0;
  if (!copy) return plan_;

  // The previous step's copies read the staging buffer asynchronously: wait for them before
  // overwriting it (normally long done; the wait is a formality on the host).
  OSSRT_CUDA_CHECK(cudaEventSynchronize(copied_));
  const Layout l = layout_for(capacity_);
  auto put = [&](size_t off, const void* src, size_t bytes) {
    if (bytes == 0) return;
    std::memcpy(staging_ + off, src, bytes);
    OSSRT_CUDA_CHECK(cudaMemcpyAsync(device_ + off, staging_ + off, bytes, cudaMemcpyHostToDevice, stream));
  };
  put(l.token_ids, p.token_ids.data(), p.token_ids.size() * 4);
  put(l.positions, p.positions.data(), p.positions.size() * 4);
  put(l.token_seq, p.token_seq.data(), p.token_seq.size() * 4);
  put(l.full_slots, p.full_slots.data(), p.full_slots.size() * 4);
  put(l.window_slots, p.window_slots.data(), p.window_slots.size() * 4);
  put(l.logit_rows, p.logit_rows.data(), p.logit_rows.size() * 4);
  put(l.seqs, p.seqs.data(), p.seqs.size() * sizeof(SeqStep));
  if (token_seqs) {
    token_seqs_.clear();
    for (const SeqStep& q : p.seqs)
      for (int i = 0; i < q.num_tokens; ++i) {
        SeqStep row = q;
        row.token_begin = q.token_begin + i;
        row.num_tokens = 1;
        row.context_begin = q.context_begin + i;
        token_seqs_.push_back(row);
      }
    put(l.token_seqs, token_seqs_.data(), token_seqs_.size() * sizeof(SeqStep));
  }
  put(l.full_table, p.full_block_table.data(), p.full_block_table.size() * 4);
  put(l.window_table, p.window_block_table.data(), p.window_block_table.size() * 4);
  const int32_t real_tokens = p.num_tokens() - p.padding_tokens;
  put(l.real_tokens, &real_tokens, 4);
  OSSRT_CUDA_CHECK(cudaEventRecord(copied_, stream));
  return plan_;
}

}  // namespace ossrt::cuda
