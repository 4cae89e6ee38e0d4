// bf16_sdpa_sinks_d64_prefill: paged causal attention with sinks for any plan (prefill chunks over
// cached context, decode tokens, mixed steps), FlashAttention-2 style on mma.sync.
//
// One CTA = (8 query tokens of one sequence) x (the 8 query heads of one KV head) = 64 rows, so each
// K/V tile is read from the cache once for all 8 heads (GQA). Row r of the tile is token r / 8,
// head r % 8; warp w owns rows 16w..16w+15 = tokens 2w and 2w+1, so the two rows a thread holds in
// the mma accumulator layout (g and g+8) are the same head of two consecutive tokens.
// Keys stream through shared memory in tiles of 64, gathered through the block table; only tiles
// that intersect the visible range [first_visible_key(p0), p_last] are visited, so a sliding layer
// touches at most 3 tiles per CTA whatever the context length.
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
constexpr int kTileTokens = kWarps * 2;          // 8 query tokens per CTA
constexpr int kTileRows = kTileTokens * kGroup;  // 64 mma rows
constexpr int kKeyTile = 64;
// Shared rows padded by 8 bf16 (16 bytes): a row is then 36 words, so the 8 rows g = 0..7 a
// fragment load touches start 4 banks apart and the 32 lanes hit 32 distinct banks.
constexpr int kPitch = kD + 8;

__global__ void __launch_bounds__(kThreads) bf16_sdpa_sinks_d64_prefill(AttentionArgs a) {
  const int seq_index = blockIdx.z;
  const int kv_head = blockIdx.y;
  const SeqStep seq = a.plan.seqs[seq_index];
  const int local0 = blockIdx.x * kTileTokens;
  if (local0 >= seq.num_tokens) return;
  const int n_tok = min(kTileTokens, seq.num_tokens - local0);
  const int row0 = seq.token_begin + local0;  // activation row of the tile's first token
  const int p0 = seq.context_begin + local0;  // its absolute position
  const int p_last = p0 + n_tok - 1;
  const int key_lo = first_visible_key(p0, a.window);

  __shared__ alignas(16) __nv_bfloat16 q_s[kTileRows][kPitch];
  __shared__ alignas(16) __nv_bfloat16 k_s[kKeyTile][kPitch];
  __shared__ alignas(16) __nv_bfloat16 vt_s[kD][kPitch];  // V transposed: [d][key]
  __shared__ bool key_ok_s[kKeyTile];

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int q_out_stride = a.num_q_heads * kD;

  // Q tile: 64 rows x 8 chunks of 16 bytes; rows of tokens past the chunk end are zero.
  for (int i = tid; i < kTileRows * (kD / 8); i += kThreads) {
    const int r = i / (kD / 8), chunk = i % (kD / 8);
    const int tok = r / kGroup, head = kv_head * kGroup + r % kGroup;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (tok < n_tok)
      v = *reinterpret_cast<const uint4*>(a.qkv + int64_t(row0 + tok) * a.qkv_row_stride + head * kD + chunk * 8);
    *reinterpret_cast<uint4*>(&q_s[r][chunk * 8]) = v;
  }
  __syncthreads();

  const int rq = warp * 16 + g;  // this thread's first row; its second is rq + 8
  uint32_t qa[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    qa[kk][0] = lds_u32(&q_s[rq][kk * 16 + 2 * c]);
    qa[kk][1] = lds_u32(&q_s[rq + 8][kk * 16 + 2 * c]);
    qa[kk][2] = lds_u32(&q_s[rq][kk * 16 + 8 + 2 * c]);
    qa[kk][3] = lds_u32(&q_s[rq + 8][kk * 16 + 8 + 2 * c]);
  }

  const int head = kv_head * kGroup + g;
  const int tok_a = 2 * warp, tok_b = 2 * warp + 1;
  const int pos_a = p0 + tok_a, pos_b = p0 + tok_b;
  const bool valid_a = tok_a < n_tok, valid_b = tok_b < n_tok;
  const float scale_log2 = a.sm_scale * kLog2e;
  // Running max starts at the sink logit, whose exp(sink - m) = 1 starts the denominator; only
  // lane c == 0 of the quad carries it so the quad reduction at the end counts it once.
  const float sink_log2 = bf16_bits_to_float(a.sinks[head]) * kLog2e;
  float m_a = sink_log2, m_b = sink_log2;
  float l_a = c == 0 ? 1.f : 0.f, l_b = l_a;
  float o[kD / 8][4];
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;

  for (int key0 = key_lo; key0 <= p_last; key0 += kKeyTile) {
    __syncthreads();  // the previous tile is no longer read
    for (int i = tid; i < kKeyTile * (kD / 8); i += kThreads) {
      const int kr = i / (kD / 8), chunk = i % (kD / 8);
      const int j = key0 + kr;
      const int64_t off = j <= p_last ? kv_row_offset(a, seq, kv_head, j) : -1;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (off >= 0) {
        kv = *reinterpret_cast<const uint4*>(a.k_cache + off + chunk * 8);
        vv = *reinterpret_cast<const uint4*>(a.v_cache + off + chunk * 8);
      }
      *reinterpret_cast<uint4*>(&k_s[kr][chunk * 8]) = kv;
      const __nv_bfloat16* ve = reinterpret_cast<const __nv_bfloat16*>(&vv);
#pragma unroll
      for (int e = 0; e < 8; ++e) vt_s[chunk * 8 + e][kr] = ve[e];
      if (chunk == 0) key_ok_s[kr] = off >= 0;
    }
    __syncthreads();

    float s[kKeyTile / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t b[2] = {lds_u32(&k_s[nt * 8 + g][kk * 16 + 2 * c]),
                               lds_u32(&k_s[nt * 8 + g][kk * 16 + 8 + 2 * c])};
        mma_bf16_m16n8k16(s[nt], qa[kk], b);
      }
    }

    float mx_a = -FLT_MAX, mx_b = -FLT_MAX;
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * c + (e & 1);
        const int j = key0 + col;
        const int pos = e < 2 ? pos_a : pos_b;
        const bool row_valid = e < 2 ? valid_a : valid_b;
        const bool visible = row_valid && key_ok_s[col] && j <= pos && (a.window == 0 || pos - j < a.window);
        s[nt][e] = visible ? s[nt][e] * scale_log2 : -INFINITY;
      }
      mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
    // m starts finite (the sink), so m_new is finite and exp2(-inf - m_new) = 0: no NaN from
    // fully masked rows or tiles.
    const float m_new_a = fmaxf(m_a, mx_a), m_new_b = fmaxf(m_b, mx_b);
    const float alpha_a = exp2f(m_a - m_new_a), alpha_b = exp2f(m_b - m_new_b);
    m_a = m_new_a;
    m_b = m_new_b;
    l_a *= alpha_a;
    l_b *= alpha_b;
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      o[dt][0] *= alpha_a;
      o[dt][1] *= alpha_a;
      o[dt][2] *= alpha_b;
      o[dt][3] *= alpha_b;
    }
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - m_a);
      s[nt][1] = exp2f(s[nt][1] - m_a);
      s[nt][2] = exp2f(s[nt][2] - m_b);
      s[nt][3] = exp2f(s[nt][3] - m_b);
      l_a += s[nt][0] + s[nt][1];
      l_b += s[nt][2] + s[nt][3];
    }

    // O += P V: the S accumulators of key tiles 2kk and 2kk+1 are exactly the A fragment of
    // keys 16kk..16kk+15, so P never leaves registers.
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        const uint32_t b[2] = {lds_u32(&vt_s[dt * 8 + g][kk * 16 + 2 * c]),
                               lds_u32(&vt_s[dt * 8 + g][kk * 16 + 8 + 2 * c])};
        mma_bf16_m16n8k16(o[dt], pa, b);
      }
    }
  }

  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;  // l >= exp2(sink - m) > 0
  __nv_bfloat16* out_a = reinterpret_cast<__nv_bfloat16*>(a.out) + int64_t(row0 + tok_a) * q_out_stride + head * kD;
  __nv_bfloat16* out_b = reinterpret_cast<__nv_bfloat16*>(a.out) + int64_t(row0 + tok_b) * q_out_stride + head * kD;
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) {
    const int d = dt * 8 + 2 * c;
    if (valid_a)
      *reinterpret_cast<__nv_bfloat162*>(out_a + d) = __floats2bfloat162_rn(o[dt][0] * inv_a, o[dt][1] * inv_a);
    if (valid_b)
      *reinterpret_cast<__nv_bfloat162*>(out_b + d) = __floats2bfloat162_rn(o[dt][2] * inv_b, o[dt][3] * inv_b);
  }
}

}  // namespace

void validate_attention_args(const AttentionArgs& a);  // attention_decode.cu

void launch_bf16_sdpa_sinks_d64_prefill(const AttentionArgs& a, cudaStream_t stream) {
  validate_attention_args(a);
  if (a.plan.num_seqs == 0 || a.plan.max_seq_tokens == 0) return;
  const dim3 grid((a.plan.max_seq_tokens + kTileTokens - 1) / kTileTokens, a.num_kv_heads, a.plan.num_seqs);
  bf16_sdpa_sinks_d64_prefill<<<grid, kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_sdpa_sinks_d64_prefill");
}

}  // namespace ossrt::cuda
