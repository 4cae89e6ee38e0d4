// RoPE, KV cache writes and paged attention with sinks on the CPU (docs/reference/SPEC.md 2.4, 2.5).
//
// Attention reads every key, including the step's own, back from the paged cache through the plan's
// block tables: that is what the CUDA kernels do, so the oracle exercises the same addressing.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/fp8.h"

namespace ossrt::cpu {

namespace {

const char* group_name(KvGroup g) { return g == KvGroup::Full ? "full" : "sliding"; }

// First key position visible to a query at `pos`: j <= pos and, with a window, pos - j < window.
int first_visible_key(int pos, int window) { return window > 0 ? std::max(0, pos - window + 1) : 0; }

// Maps logical block `logical` of sequence `s` to its physical block in the layer's pool.
int physical_block(const StepPlan& plan, const SeqStep& s, KvGroup group, int logical) {
  if (group == KvGroup::Full) return plan.full_block_table[size_t(s.full_table_begin + logical)];
  return plan.window_block_table[size_t(s.window_table_begin + (logical - s.window_first_block))];
}

const std::vector<int32_t>& slots_of(const StepPlan& plan, KvGroup group) {
  return group == KvGroup::Full ? plan.full_slots : plan.window_slots;
}

// The 256 values of core/fp8.h's e4m3_to_f32, looked up instead of decoded per element.
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = e4m3_to_f32(uint8_t(c));
    return t;
  }();
  return table;
}

void store_e4m3(const float* src, int n, float scale, uint8_t* dst) {
  for (int d = 0; d < n; ++d) dst[d] = e4m3_from_f32(src[d] / scale);
}

void load_e4m3(const uint8_t* src, int n, float scale, float* dst) {
  const std::array<float, 256>& values = e4m3_values();
  for (int d = 0; d < n; ++d) dst[d] = values[src[d]] * scale;
}

}  // namespace

void check_write_slots(const StepPlan& plan, const AttentionParams& params, const KvLayerView& kv) {
  const char* g = group_name(params.group);
  const auto& slots = slots_of(plan, params.group);
  OSSRT_CHECK(int(slots.size()) == plan.num_tokens(), "plan has {} {} slots for {} tokens", slots.size(), g,
              plan.num_tokens());
  const int64_t capacity = int64_t(kv.num_blocks) * kv.block_size;
  for (size_t t = 0; t < slots.size(); ++t)
    OSSRT_CHECK(slots[t] >= 0 && slots[t] < capacity, "token {}: {} slot {} outside the cache ({} slots)", t, g,
                slots[t], capacity);
}

void check_block_tables(const StepPlan& plan, const AttentionParams& params, const KvLayerView& kv) {
  const char* g = group_name(params.group);
  const auto& table = params.group == KvGroup::Full ? plan.full_block_table : plan.window_block_table;
  for (int si = 0; si < plan.num_seqs(); ++si) {
    const SeqStep& s = plan.seqs[size_t(si)];
    if (s.num_tokens == 0) continue;
    const int last_pos = s.context_begin + s.num_tokens - 1;
    const int first_block = first_visible_key(s.context_begin, params.window) / kv.block_size;
    const int last_block = last_pos / kv.block_size;
    int table_begin, table_len, table_first_logical;
    if (params.group == KvGroup::Full) {
      table_begin = s.full_table_begin, table_len = s.full_table_len, table_first_logical = 0;
    } else {
      table_begin = s.window_table_begin, table_len = s.window_table_len, table_first_logical = s.window_first_block;
    }
    OSSRT_CHECK(table_first_logical <= first_block && last_block < table_first_logical + table_len,
                "sequence {}: {} block table covers logical blocks [{}, {}) but positions {}..{} (window {}) "
                "need [{}, {}]",
                si, g, table_first_logical, table_first_logical + table_len, s.context_begin, last_pos, params.window,
                first_block, last_block);
    OSSRT_CHECK(table_begin >= 0 && size_t(table_begin + table_len) <= table.size(),
                "sequence {}: {} block table range [{}, {}) outside the plan's table of {} entries", si, g, table_begin,
                table_begin + table_len, table.size());
    for (int b = first_block; b <= last_block; ++b) {
      const int phys = table[size_t(table_begin + b - table_first_logical)];
      OSSRT_CHECK(phys >= 0 && phys < kv.num_blocks, "sequence {}: {} logical block {} maps to block {} of {}", si, g,
                  b, phys, kv.num_blocks);
    }
  }
}

void rope_and_cache_write(ThreadPool& pool, const StepPlan& plan, float* qkv, const RopeParams& rope,
                          const AttentionParams& params, const KvLayerView& kv) {
  const int D = params.head_dim, half = D / 2;
  const int Hq = params.num_q_heads, Hkv = params.num_kv_heads;
  const int64_t row_stride = int64_t(Hq + 2 * Hkv) * D;
  const auto& slots = slots_of(plan, params.group);
  pool.parallel_for(plan.num_tokens(), [&](int64_t begin, int64_t end) {
    std::vector<float> cos_c(static_cast<size_t>(half)), sin_c(static_cast<size_t>(half));
    for (int64_t t = begin; t < end; ++t) {
      // The reference's float32 angle, not an exact one (backend.h rope_cos_sin).
      const int32_t pos = plan.positions[size_t(t)];
      for (int i = 0; i < half; ++i)
        rope_cos_sin(pos, rope.inv_freq[size_t(i)], rope.concentration, cos_c[size_t(i)], sin_c[size_t(i)]);
      float* row = qkv + t * row_stride;
      // q heads then k heads are contiguous at the start of the row; v is not rotated.
      for (int head = 0; head < Hq + Hkv; ++head) {
        float* x = row + int64_t(head) * D;
        for (int i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * cos_c[size_t(i)] - x2 * sin_c[size_t(i)];
          x[i + half] = x2 * cos_c[size_t(i)] + x1 * sin_c[size_t(i)];
        }
      }
      const int slot = slots[size_t(t)];
      const int block = slot / kv.block_size, in_block = slot % kv.block_size;
      for (int g = 0; g < Hkv; ++g) {
        const float* k_src = row + int64_t(Hq + g) * D;
        const float* v_src = row + int64_t(Hq + Hkv + g) * D;
        const int64_t at = kv.offset(block, g, in_block);
        if (kv.fp8()) {
          store_e4m3(k_src, D, kv.k_scale[g], kv.k8 + at);
          store_e4m3(v_src, D, kv.v_scale[g], kv.v8 + at);
        } else {
          std::copy(k_src, k_src + D, kv.k + at);
          std::copy(v_src, v_src + D, kv.v + at);
        }
      }
    }
  });
}

void attention(ThreadPool& pool, const StepPlan& plan, const float* qkv, const float* sinks,
               const AttentionParams& params, const KvLayerView& kv, float* out) {
  const int D = params.head_dim, Hq = params.num_q_heads, Hkv = params.num_kv_heads;
  const int queries_per_kv = Hq / Hkv;
  const int64_t row_stride = int64_t(Hq + 2 * Hkv) * D;
  const int bs = kv.block_size;
  pool.parallel_for(int64_t(plan.num_tokens()) * Hq, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(D));
    std::vector<float> k_row(static_cast<size_t>(D)), v_row(static_cast<size_t>(D));  // fp8: dequantized
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / Hq;
      const int h = int(task % Hq);
      const int g = h / queries_per_kv;  // GQA: consecutive query heads share a KV head
      const SeqStep& s = plan.seqs[size_t(plan.token_seq[size_t(t)])];
      const int pos = plan.positions[size_t(t)];
      const int first = first_visible_key(pos, params.window);
      const float* q = qkv + t * row_stride + int64_t(h) * D;
      auto key_offset = [&](int j) { return kv.offset(physical_block(plan, s, params.group, j / bs), g, j % bs); };
      auto key = [&](int j) -> const float* {
        if (!kv.fp8()) return kv.k + key_offset(j);
        load_e4m3(kv.k8 + key_offset(j), D, kv.k_scale[g], k_row.data());
        return k_row.data();
      };
      auto value = [&](int j) -> const float* {
        if (!kv.fp8()) return kv.v + key_offset(j);
        load_e4m3(kv.v8 + key_offset(j), D, kv.v_scale[g], v_row.data());
        return v_row.data();
      };

      // Pass 1: scaled logits of the visible keys; the running max starts at the sink logit, which
      // is neither scaled nor masked.
      scores.resize(size_t(pos - first + 1));
      float max_logit = sinks[h];
      for (int j = first; j <= pos; ++j) {
        const float logit = dot(q, key(j), D) * params.sm_scale;
        scores[size_t(j - first)] = logit;
        max_logit = std::max(max_logit, logit);
      }
      // Pass 2: softmax over [logits..., sink]; the sink only adds to the denominator.
      double denom = std::exp(double(sinks[h]) - double(max_logit));
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int j = first; j <= pos; ++j) {
        const float p = std::exp(scores[size_t(j - first)] - max_logit);
        denom += p;
        const float* v = value(j);
        for (int d = 0; d < D; ++d) acc[size_t(d)] += p * v[d];
      }
      float* o = out + t * int64_t(Hq) * D + int64_t(h) * D;
      const float inv_denom = float(1.0 / denom);
      for (int d = 0; d < D; ++d) o[d] = acc[size_t(d)] * inv_denom;
    }
  });
}

}  // namespace ossrt::cpu
