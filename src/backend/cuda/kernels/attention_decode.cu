// bf16_sdpa_sinks_d64_decode: one query token per sequence, split-KV.
//
// Decode reads the whole visible context for a handful of query rows, so it is bandwidth-bound and
// tensor cores buy nothing (8 rows would fill half an m16 tile). Instead:
//   pass 1 (grid splits x Hkv x seqs): each CTA takes a contiguous slice of the sequence's visible
//     keys, for all 8 query heads of its KV head. Lane i of a warp scores key i of a 32-key chunk
//     (the K row read once, 8 dot products against q in shared memory); then the warp accumulates
//     P V with lane i owning dims 2i, 2i+1, so V rows are read coalesced. The CTA writes an
//     unnormalised partial (max m, sum l, acc) per head, starting from m = -inf, l = 0: the sink
//     is left out here so it is counted once, in
//   pass 2 (grid seqs x Hq/8): merges the partials of each head with the sink logit as the initial
//     max, then normalises and writes bf16.
// The split bounds are computed per sequence on the device from its own context, so one grid
// (one captured graph) serves any mix of context lengths.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/attention_paging.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kD = kAttnHeadDim;
constexpr int kGroup = kAttnQHeadsPerKvHead;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 32;  // keys per warp iteration: one per lane
// A split never takes fewer keys than this, so short contexts use few splits (the rest exit).
constexpr int kMinKeysPerSplit = 2 * kChunk;

struct DecodePartials {
  float* acc;  // [num_seqs][Hq][splits][64]
  float* m;    // [num_seqs][Hq][splits]
  float* l;    // [num_seqs][Hq][splits]
};

__host__ __device__ inline DecodePartials decode_partials(void* ws, int num_seqs, int num_q_heads, int splits) {
  const int64_t states = int64_t(num_seqs) * num_q_heads * splits;
  float* base = static_cast<float*>(ws);
  return {base, base + states * kD, base + states * (kD + 1)};
}

// Key slice [begin, end) of split `split` within the visible range [lo, hi]. The slice size depends
// only on the sequence's own visible length, not on the grid, so a sequence gets bit-identical
// partials whatever the batch (batch invariance), as long as the grid has the splits it needs
// (attention_decode_splits(max_context) guarantees that). With a smaller grid the slices grow to
// cover the range anyway: never wrong, only not batch-invariant.
__device__ inline void split_range(int lo, int hi, int splits, int split, int& begin, int& end) {
  const int n = hi - lo + 1;
  const int own = max((n + kAttnMaxDecodeSplits - 1) / kAttnMaxDecodeSplits, kMinKeysPerSplit);
  const int cover = (n + splits - 1) / splits;
  const int per = (max(own, cover) + kChunk - 1) / kChunk * kChunk;
  begin = lo + split * per;
  end = min(begin + per, hi + 1);
}

__global__ void __launch_bounds__(kThreads) bf16_sdpa_sinks_d64_decode(AttentionArgs a) {
  const int split = blockIdx.x, kv_head = blockIdx.y, seq_index = blockIdx.z;
  const SeqStep seq = a.plan.seqs[seq_index];
  if (seq.num_tokens != 1) return;  // padding (0 tokens); the launcher rejects > 1
  const int pos = seq.context_begin;
  int begin, end;
  split_range(first_visible_key(pos, a.window), pos, a.num_splits, split, begin, end);

  __shared__ alignas(16) float q_s[kGroup][kD];  // pre-scaled by sm_scale * log2(e)
  __shared__ float p_s[kWarps][kGroup][kChunk];
  __shared__ int64_t vrow_s[kWarps][kChunk];
  __shared__ float m_s[kWarps][kGroup], l_s[kWarps][kGroup];
  __shared__ float acc_s[kWarps][kGroup][kD];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const float scale_log2 = a.sm_scale * kLog2e;
  const uint16_t* q = a.qkv + int64_t(seq.token_begin) * a.qkv_row_stride + kv_head * kGroup * kD;
  for (int i = tid; i < kGroup * kD; i += kThreads) q_s[i / kD][i % kD] = bf16_bits_to_float(q[i]) * scale_log2;
  __syncthreads();

  float m[kGroup], l[kGroup], acc[kGroup][2];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) m[h] = -INFINITY, l[h] = 0.f, acc[h][0] = acc[h][1] = 0.f;

  for (int key0 = begin + warp * kChunk; key0 < end; key0 += kWarps * kChunk) {
    const int j = key0 + lane;
    const int64_t off = j < end ? kv_row_offset(a, seq, kv_head, j) : -1;
    float s[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) s[h] = 0.f;
    if (off >= 0) {
      const uint4* krow = reinterpret_cast<const uint4*>(a.k_cache + off);
#pragma unroll
      for (int chunk = 0; chunk < kD / 8; ++chunk) {
        const uint4 kv = krow[chunk];
        const uint32_t words[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float2 kf = unpack_bf16x2(words[w]);
          const int d = chunk * 8 + 2 * w;
#pragma unroll
          for (int h = 0; h < kGroup; ++h) s[h] += q_s[h][d] * kf.x + q_s[h][d + 1] * kf.y;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (off < 0) s[h] = -INFINITY;
      const float m_new = fmaxf(m[h], warp_max(s[h]));
      // m_new is -inf only while every key so far was masked; keep p = 0 and skip the rescale then.
      const float p = m_new == -INFINITY ? 0.f : exp2f(s[h] - m_new);
      const float alpha = m_new == -INFINITY ? 1.f : exp2f(m[h] - m_new);
      m[h] = m_new;
      l[h] = l[h] * alpha + p;  // lane-partial sum; all lanes share m, reduced at the end
      acc[h][0] *= alpha;
      acc[h][1] *= alpha;
      p_s[warp][h][lane] = p;
    }
    vrow_s[warp][lane] = off;
    __syncwarp();
    const int n_keys = min(kChunk, end - key0);
    for (int i = 0; i < n_keys; ++i) {
      const int64_t voff = vrow_s[warp][i];
      if (voff < 0) continue;  // masked key: p is 0 and its row may not exist
      const float2 v = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(a.v_cache + voff + 2 * lane));
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        const float p = p_s[warp][h][i];
        acc[h][0] += p * v.x;
        acc[h][1] += p * v.y;
      }
    }
    __syncwarp();  // p_s / vrow_s are rewritten by the next chunk
  }

  // Merge the 4 warps' states, then write this split's partial per head.
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    const float lsum = warp_sum(l[h]);
    if (lane == 0) m_s[warp][h] = m[h], l_s[warp][h] = lsum;
    acc_s[warp][h][2 * lane] = acc[h][0];
    acc_s[warp][h][2 * lane + 1] = acc[h][1];
  }
  __syncthreads();
  const DecodePartials part = decode_partials(a.workspace, a.plan.num_seqs, a.num_q_heads, a.num_splits);
  for (int i = tid; i < kGroup * kD; i += kThreads) {
    const int h = i / kD, d = i % kD;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w][h]);
    float lsum = 0.f, o = 0.f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(m_s[w][h] - mx);
        lsum += l_s[w][h] * f;
        o += acc_s[w][h][d] * f;
      }
    }
    const int64_t state = (int64_t(seq_index) * a.num_q_heads + kv_head * kGroup + h) * a.num_splits + split;
    part.acc[state * kD + d] = o;
    if (d == 0) part.m[state] = mx, part.l[state] = lsum;
  }
}

// One warp per query head; lane i owns dims 2i, 2i+1.
__global__ void __launch_bounds__(kGroup * 32) bf16_sdpa_sinks_d64_decode_combine(AttentionArgs a) {
  const int seq_index = blockIdx.x;
  const SeqStep seq = a.plan.seqs[seq_index];
  if (seq.num_tokens != 1) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = blockIdx.y * kGroup + warp;
  const DecodePartials part = decode_partials(a.workspace, a.plan.num_seqs, a.num_q_heads, a.num_splits);
  const int64_t state0 = (int64_t(seq_index) * a.num_q_heads + head) * a.num_splits;
  const float sink_log2 = bf16_bits_to_float(a.sinks[head]) * kLog2e;
  float mx = sink_log2;
  for (int sp = 0; sp < a.num_splits; ++sp) mx = fmaxf(mx, part.m[state0 + sp]);
  float lsum = exp2f(sink_log2 - mx), o0 = 0.f, o1 = 0.f;
  for (int sp = 0; sp < a.num_splits; ++sp) {
    const float f = exp2f(part.m[state0 + sp] - mx);  // empty split: m = -inf -> 0
    lsum += part.l[state0 + sp] * f;
    const float2 acc = *reinterpret_cast<const float2*>(part.acc + (state0 + sp) * kD + 2 * lane);
    o0 += acc.x * f;
    o1 += acc.y * f;
  }
  __nv_bfloat16* out =
      reinterpret_cast<__nv_bfloat16*>(a.out) + int64_t(seq.token_begin) * a.num_q_heads * kD + head * kD + 2 * lane;
  *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(o0 / lsum, o1 / lsum);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void validate_attention_args(const AttentionArgs& a) {
  OSSRT_CU_CHECK(a.num_q_heads > 0 && a.num_kv_heads > 0 && a.num_q_heads == a.num_kv_heads * kGroup,
                 "attention: the kernels are built for ", kGroup, " query heads per KV head, got ", a.num_q_heads,
                 " q / ", a.num_kv_heads, " kv heads");
  OSSRT_CU_CHECK(a.window >= 0, "attention: negative window ", a.window);
  OSSRT_CU_CHECK(a.plan.block_size > 0, "attention: block_size must be positive, got ", a.plan.block_size);
  OSSRT_CU_CHECK(a.plan.num_seqs >= 0 && a.plan.num_tokens >= 0 && a.plan.max_seq_tokens >= 0,
                 "attention: negative plan sizes");
  if (a.plan.num_seqs == 0) return;
  OSSRT_CU_CHECK(a.plan.seqs && a.qkv && a.sinks && a.k_cache && a.v_cache && a.out,
                 "attention: null plan, qkv, sinks, cache or output pointer");
  OSSRT_CU_CHECK(a.sliding ? a.plan.window_block_table != nullptr : a.plan.full_block_table != nullptr,
                 "attention: the plan has no ", a.sliding ? "window" : "full", " block table");
  OSSRT_CU_CHECK(a.qkv_row_stride >= int64_t(a.num_q_heads + 2 * a.num_kv_heads) * kD && a.qkv_row_stride % 8 == 0,
                 "attention: qkv row stride ", a.qkv_row_stride,
                 " must hold (Hq + 2 Hkv) * 64 elements and be a multiple of 8");
  OSSRT_CU_CHECK(aligned16(a.qkv) && aligned16(a.k_cache) && aligned16(a.v_cache),
                 "attention: qkv and KV cache must be 16-byte aligned (vector loads)");
  OSSRT_CU_CHECK(a.num_blocks > 0, "attention: the KV pool has no blocks");
}

int attention_decode_splits(int num_seqs, int num_kv_heads, int max_context, int num_sms) {
  // Only the context decides: each sequence slices its keys by its own length (split_range), so
  // the grid needs as many splits as the longest context uses. Batch size and SM count do not
  // enter, which keeps results independent of the batch.
  (void)num_seqs, (void)num_kv_heads, (void)num_sms;
  const int needed = (std::max(max_context, 1) + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return std::clamp(needed, 1, kAttnMaxDecodeSplits);
}

size_t attention_decode_workspace_bytes(int num_seqs, int num_q_heads, int num_splits) {
  return size_t(num_seqs) * num_q_heads * num_splits * (kD + 2) * sizeof(float);
}

void launch_bf16_sdpa_sinks_d64_decode(const AttentionArgs& a, cudaStream_t stream) {
  validate_attention_args(a);
  if (a.plan.num_seqs == 0) return;
  OSSRT_CU_CHECK(a.plan.max_seq_tokens <= 1, "attention decode: a sequence runs ", a.plan.max_seq_tokens,
                 " tokens (decode takes 1)");
  OSSRT_CU_CHECK(a.num_splits >= 1 && a.num_splits <= kAttnMaxDecodeSplits, "attention decode: num_splits ",
                 a.num_splits, " not in [1, ", kAttnMaxDecodeSplits, "]");
  const size_t need = attention_decode_workspace_bytes(a.plan.num_seqs, a.num_q_heads, a.num_splits);
  OSSRT_CU_CHECK(a.workspace && a.workspace_bytes >= need && aligned16(a.workspace), "attention decode: workspace of ",
                 need, " bytes (16-byte aligned) needed, ", a.workspace_bytes, " given");
  bf16_sdpa_sinks_d64_decode<<<dim3(a.num_splits, a.num_kv_heads, a.plan.num_seqs), kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_sdpa_sinks_d64_decode");
  bf16_sdpa_sinks_d64_decode_combine<<<dim3(a.plan.num_seqs, a.num_kv_heads), kGroup * 32, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_sdpa_sinks_d64_decode_combine");
}

void launch_bf16_sdpa_sinks_d64(const AttentionArgs& a, cudaStream_t stream) {
  if (a.plan.max_seq_tokens == 1)
    launch_bf16_sdpa_sinks_d64_decode(a, stream);
  else
    launch_bf16_sdpa_sinks_d64_prefill(a, stream);
}

}  // namespace ossrt::cuda
