// bf16_sdpa_sinks_d64_decode: one query token per sequence, split-KV, on tensor cores.
//
//   pass 1 (grid splits x Hkv x seqs, 4 warps): each CTA takes a contiguous slice of the sequence's
//     visible keys for all 8 query heads of its KV head, so every K/V row is read from DRAM once.
//     Keys stream through shared memory in 64-key tiles (K and V, cp.async, a ring of kRing tiles
//     with kRing - 1 in flight while one is computed: a CTA is latency-bound on its loads at one
//     sequence and long contexts, so the depth is what sets its bandwidth); warp
//     w takes keys 16w..16w+15 of each tile. Scores are one m16n8k16 MMA chain S^T = K Q^T (the
//     warp's 16 keys as rows, K's A fragments from ldmatrix; the 8 heads as columns, Q^T's B
//     fragments in registers); P^T (bf16, as in the prefill kernel; transposed from the accumulator
//     layout into B fragments by movmatrix) then gives O^T += V^T P^T with V^T's A fragments from
//     ldmatrix.trans. Each warp keeps its own online
//     softmax state (base 2); the CTA merges its 4 warps and writes an unnormalised partial
//     (max m, sum l, acc) per head, starting from m = -inf, l = 0: the sink is left out here so it
//     is counted once, in
//   pass 2 (grid seqs x Hq/8): merges the partials of each head with the sink logit as the initial
//     max, then normalises and writes bf16. Given tickets (AttentionArgs::tickets), pass 1's last
//     split CTA of each (sequence, KV head) does this merge itself and pass 2 is not launched.
// The split bounds are computed per sequence on the device from its own context (at least
// AttentionArgs::min_keys_per_split keys a split: 128 to 1,024 by the step's sequence count), so one
// grid (one captured graph) serves any mix of context lengths; splits beyond what a sequence needs
// exit at once and write nothing, and pass 2 reads only the used ones.
// An fp8 cache (attention.cuh): pass 1 streams the codes through the same ring (half the bytes) and
// each warp converts its fragments straight from the landed codes (f16 MMAs, keys and dims in the
// order that makes those loads wide: fp8_s_row_key); the K scale multiplies the logit scale, the V
// scale the partial's acc. Pass 2 is the same.
#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/attention_paging.cuh"
#include "backend/cuda/kernels/kv_fp8.cuh"
#include "backend/cuda/kernels/ldmatrix.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kD = kAttnHeadDim;
constexpr int kGroup = kAttnQHeadsPerKvHead;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileKeys = 64;                  // keys per shared-memory tile, 16 per warp
constexpr int kWarpKeys = kTileKeys / kWarps;  // 16: one MMA k-step of P.V
// Shared rows padded to 72 bf16 (144 bytes): the 8 rows an ldmatrix phase touches start 16 bytes
// apart modulo 128, so they hit distinct banks; 144 keeps 16-byte alignment.
constexpr int kPitch = kD + 8;
// Pool blocks of a split the decode kernel keeps in shared memory: 2,048 keys at 16 a block (the
// longest context's slices at 64 splits).
constexpr int kBlockCache = 128;

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

// Keys per split for a visible range of n keys on a grid of `splits`. The size depends only on the
// sequence's own visible length, not on the grid, so a sequence gets bit-identical partials whatever
// the batch (batch invariance), as long as the grid has the splits it needs
// (attention_decode_splits(max_context) guarantees that). With a smaller grid the slices grow to
// cover the range anyway: never wrong, only not batch-invariant. Whole tiles, so the tile grid of a
// split starts at its first key.
// A split never takes fewer than min_keys keys, so short contexts use few splits (the rest exit).
__host__ __device__ inline int keys_per_split(int n, int splits, int min_keys, int max_splits) {
  const int spread = (n + max_splits - 1) / max_splits;
  const int own = spread > min_keys ? spread : min_keys;
  const int cover = (n + splits - 1) / splits;
  return ((own > cover ? own : cover) + kTileKeys - 1) / kTileKeys * kTileKeys;
}

// ---- The fp8 cache's tiles, read straight into f16 MMA fragments (no bf16 tile in shared memory).
// e4m3 -> f16 is one exact conversion a pair (cvt.rn.f16x2.e4m3x2); e4m3 -> bf16 takes four (through
// f32), so the fp8 kernel multiplies in f16: K and V codes exactly, q in f16 (see decode_q_f16_shift),
// P rounded to f16 instead of bf16 (11 significant bits instead of 8; below 2^-14 fewer, 0 below 2^-25).

// The two e4m3 codes in the low (kHigh = false) or high half of w as an f16x2 of their values, exactly.
template <bool kHigh>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(kHigh ? w >> 16 : w & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// Byte offset of 16-byte chunk u (0..3) of row r (0..63) in a code tile (64-byte rows). Rows are
// placed at r ^ ((r >> 2) & 1) and chunks at u ^ ((r >> 2) & 2) so that the fragment loads below are
// free of bank conflicts: K's 16-byte loads read two adjacent rows of a 4-row group a quarter warp, and
// V's 8-byte loads read, at each of its four steps, rows 4c + j of the warp's 16 for c = 0..3 (256
// bytes apart: without the row swap half the banks, without the chunk swap two rows a bank).
__device__ __forceinline__ uint32_t code_tile_offset(int r, int u) {
  return uint32_t((r ^ ((r >> 2) & 1)) * kKvFp8RowBytes + (u ^ ((r >> 2) & 2)) * 16);
}

// The fp8 kernel's order of keys and dims inside its MMAs (any order gives the same sums but for the
// tensor cores' fp32 rounding order; this one makes every fragment a few wide loads of codes):
// - S^T = K Q^T: MMA row i (i < 8) of the warp's 16 keys is key 4 (i / 2) + i % 2, row i + 8 that
//   key + 2; thread (g, c) reads its rows' codes at dims 16c..16c+15 (one 16-byte load a row), and the
//   k step kk's fragment slots 2c, 2c+1 / 2c+8, 2c+9 are dims 16c + 4kk + 0, 1 / 2, 3 (Q^T's B
//   fragments are built in the same order).
// - Then P^T (moved into B fragments by movmatrix) holds keys 4c, 4c+1 / 4c+2, 4c+3 at slots 2c, 2c+1
//   / 2c+8, 2c+9, so O^T += V^T P^T takes thread (g, c)'s V codes of keys 4c..4c+3 at dims 8g..8g+7
//   (an 8-byte load a key); its m step dm's rows g / g + 8 are dims 8g + 2dm / + 1.
__device__ __forceinline__ int fp8_s_row_key(int g) { return 4 * (g >> 1) + (g & 1); }

// q's f16 copy is q x 2^-shift, the logit scale takes 2^shift back: shift > 0 only when max |q| of
// the CTA's 8 heads >= 2^15 (then q stays below 2^15; bf16 up to 65,280 would fit, this keeps a
// margin). A bf16 q converts exactly when q x 2^-shift >= 2^-17 (f16's subnormals keep its 8
// significant bits down to there); smaller ones are rounded to a multiple of 2^-24, an error under
// 2^-25 x 2^shift in a logit per unit of key.
__device__ __forceinline__ int decode_q_f16_shift(float abs_max) {
  // floor(log2(abs_max)); 128 for inf (shift 114: 2^-114 still a normal float). fmaxf drops NaNs.
  const int e = int((__float_as_uint(abs_max) >> 23) & 0xffu) - 127;
  return e >= 15 ? e - 14 : 0;
}

// The splits a sequence of visible length n uses on a grid of `splits` (the others exit unwritten).
__device__ __forceinline__ int used_splits(int n, int splits, int min_keys, int max_splits) {
  const int per = keys_per_split(n, splits, min_keys, max_splits);
  return min(splits, (n + per - 1) / per);
}

// Merges the `used` split partials of each of kHeads query heads of sequence seq_index, with the sink
// logit as the initial max, normalises and writes dims 2 lane, 2 lane + 1 as bf16. Reads the partials
// through L2 (__ldcg): in the folded merge other CTAs of the same grid wrote them. Lane sp loads
// split sp's max and sum, so those are one L2 round trip, not one a split (a serial loop over 32
// splits cost ~25 us at long contexts, on the layer's critical path); the max and the weighted sum
// are warp reductions (xor butterflies: every lane gets the same bits), and the acc loop keeps
// 16 splits' loads in flight (8 left the folded merge of 64 splits ~8 L2 round trips long). With
// one split this is the arithmetic of the kernel's own one-split merge (bf16_sdpa_sinks_d64_decode,
// `alone`), bit for bit.
// kHeads heads at once (head0, head0 + head_step, ...): their loads are in flight together (the folded
// merge gives each of its 4 warps 2 of the 8 heads); each head's arithmetic is the one-head merge's.
template <int kHeads>
__device__ __forceinline__ void merge_heads_splits(const AttentionArgs& a, const SeqStep& seq, int seq_index, int head0,
                                                   int head_step, int used, int lane) {
  constexpr int kPerLane = (kAttnMaxDecodeSplits + 31) / 32;  // lane holds splits lane + 32 i
  const DecodePartials part = decode_partials(a.workspace, a.plan.num_seqs, a.num_q_heads, a.num_splits);
  int64_t state0[kHeads];
  float mx[kHeads], m_own[kHeads][kPerLane], l_own[kHeads][kPerLane], f_own[kHeads][kPerLane];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const int head = head0 + h * head_step;
    state0[h] = (int64_t(seq_index) * a.num_q_heads + head) * a.num_splits;
    mx[h] = bf16_bits_to_float(a.sinks[head]) * kLog2e;  // the sink logit: the initial max
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int sp = lane + 32 * i;
      m_own[h][i] = sp < used ? __ldcg(part.m + state0[h] + sp) : -INFINITY;
      l_own[h][i] = sp < used ? __ldcg(part.l + state0[h] + sp) : 0.f;
    }
  }
  float lsum[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const float sink_log2 = mx[h];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) mx[h] = fmaxf(mx[h], m_own[h][i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], o));
    float weighted = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      f_own[h][i] = lane + 32 * i < used ? exp2f(m_own[h][i] - mx[h]) : 0.f;  // all keys masked: m = -inf -> 0
      weighted += __fmul_rn(l_own[h][i], f_own[h][i]);  // not an FMA: the one-split merge rounds the same
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) weighted += __shfl_xor_sync(0xffffffffu, weighted, o);
    lsum[h] = exp2f(sink_log2 - mx[h]);
    lsum[h] += weighted;
  }
  float o0[kHeads] = {}, o1[kHeads] = {};
#pragma unroll(16 / kHeads)
  for (int sp = 0; sp < used; ++sp) {
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float f_src = f_own[h][0];
#pragma unroll
      for (int i = 1; i < kPerLane; ++i)
        if (sp >= 32 * i) f_src = f_own[h][i];
      const float f = __shfl_sync(0xffffffffu, f_src, sp % 32);
      const float2 acc = __ldcg(reinterpret_cast<const float2*>(part.acc + (state0[h] + sp) * kD + 2 * lane));
      o0[h] += acc.x * f;
      o1[h] += acc.y * f;
    }
  }
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const int head = head0 + h * head_step;
    __nv_bfloat16* out =
        reinterpret_cast<__nv_bfloat16*>(a.out) + int64_t(seq.token_begin) * a.num_q_heads * kD + head * kD + 2 * lane;
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(o0[h] / lsum[h], o1[h] / lsum[h]);
  }
}

// Dynamic shared memory of the decode kernel: the ring of kRing landed tiles (bf16 rows the MMAs read,
// or fp8 codes the MMAs' fragments are converted from). The warps' partial states (DecodeMerge) reuse
// it after the last tile.
struct DecodeMerge {
  float m[kWarps][kGroup], l[kWarps][kGroup];
  float acc[kWarps][kGroup][kD];
};
template <KvCacheElem kElem, int kRing>
struct DecodeSmem {
  static constexpr bool kFp8 = kElem == KvCacheElem::Fp8E4m3;
  static constexpr size_t kBf16Tile = size_t(kTileKeys) * kPitch * sizeof(__nv_bfloat16);
  static constexpr size_t kCodeTile = size_t(kTileKeys) * kKvFp8RowBytes;
  static constexpr int kBf16Tiles = kFp8 ? 0 : kRing;  // per K and per V
  static constexpr size_t kCodes = kFp8 ? 2 * kRing * kCodeTile : 0;
  static constexpr size_t kBytesRaw = 2 * kBf16Tiles * kBf16Tile + kCodes;
  static constexpr size_t kBytes = kBytesRaw > sizeof(DecodeMerge) ? kBytesRaw : sizeof(DecodeMerge);
};

// The decode kernel is built in two forms. The plain one serves the decode step as the server runs it
// (16-token pool blocks, the split's block-table entries cached, the prologue's cache rows, which may
// be any but the query's own, requested before the PDL wait): those are constants in it, so its block
// arithmetic folds to shifts and masks and the other settings' branches are gone (ring 4: 3,096 SASS
// instructions against the generic form's 8,616 over a bf16 cache, 2,496 against 5,352 over fp8). At batch 1 a launch
// is a few microseconds of mostly serial work on a few dozen SMs, after other kernels of the layer, so the instruction
// stream it fetches is part of its latency (session 36: c55e4cf's smaller kernel was ~1.9 us a layer faster there). The
// generic form reads them from AttentionArgs: other block sizes (tests), the block cache's A/B switch, verify steps'
// rows (attention_decode_plain_form says which form a launch takes).
enum class DecodeForm { kGeneric, kPlainBlock16 };
constexpr int kDecodePlainBlockSize = 16, kDecodePlainBlockShift = 4;
static_assert(kDecodePlainBlockSize == 1 << kDecodePlainBlockShift);

// CTAs an SM the kernel is built for at the rings that serve many-CTA grids (many sequences): the
// 2-tile ring's shared memory (bf16: 37 KB + 0.6 KB static + 1 KB reserved, 38,656 bytes in 128-byte
// units; fp8: 16 KB of codes) and the fp8 kernel's 4-tile ring (32 KB: it holds three 8 KB tiles in
// flight where bf16's 2-tile ring holds one of 16 KB) allow 6 in the SM's 233,472, if a thread keeps
// to 80 registers (65,536 / (6 x 128) = 85, allocated 8 at a time). The other rings serve grids of at
// most 3 CTAs an SM (attention_decode_ring), so registers do not limit them, but the 3-tile ring's:
// built for 4 CTAs an SM (bf16: 55 KB + 0.7 + 1 reserved, four in 233,472 bytes; 128 registers), it
// keeps a grid of up to 4 CTAs an SM resident with two tiles in flight each (one long sequence's 64
// splits: 512 CTAs on 132 SMs).
template <KvCacheElem kElem, int kRing>
constexpr int decode_ctas_per_sm() {
  if (kRing == 2 || (kElem == KvCacheElem::Fp8E4m3 && kRing == 4)) return 6;
  return kRing == 3 ? 4 : 1;
}
template <KvCacheElem kElem, int kRing>
constexpr int kDecodeCtasPerSm = decode_ctas_per_sm<kElem, kRing>();

template <KvCacheElem kElem, int kRing, DecodeForm kForm>
__global__ void __launch_bounds__(kThreads, kDecodeCtasPerSm<kElem, kRing>)
    bf16_sdpa_sinks_d64_decode(AttentionArgs a) {
  constexpr bool kFp8 = kElem == KvCacheElem::Fp8E4m3;
  // The plain decode step's form (DecodeForm): the block size, the block cache and the rows before
  // the wait as constants; the generic form reads them from the arguments.
  constexpr bool kPlain = kForm == DecodeForm::kPlainBlock16;
  const bool kv_after_wait = !kPlain && a.kv_after_wait;
  const bool cache_split_blocks = kPlain || a.cache_split_blocks;
  using Smem = DecodeSmem<kElem, kRing>;
  // bf16: the cp.async ring of kRing tiles the MMAs read; fp8: the ring holds codes (k8_s, v8_s,
  // rows and chunks placed by code_tile_offset) that the warps convert into their fragments.
  constexpr int kStages = Smem::kBf16Tiles;
  // Launched with PDL (docs/kernels.md). Before pdl_wait() the CTA reads only what no kernel of the
  // step writes: the plan and block tables (uploaded before the step) and the cache rows of keys
  // before `pos` (written by earlier steps; this step's QKV kernel writes only the slot of `pos`).
  // So the first two tiles but the row of `pos` are requested before the wait, and after it only q
  // and that row: the previous kernel's tail hides the cache's DRAM latency.
  const int split = blockIdx.x, kv_head = blockIdx.y, seq_index = blockIdx.z;
  const SeqStep seq = a.plan.seqs[seq_index];
  if (seq.num_tokens != 1) return;  // padding (0 tokens; another CTA waits); the launcher rejects > 1
  const int pos = seq.context_begin;
  const int lo = first_visible_key(pos, a.window);
  const int per = keys_per_split(pos - lo + 1, a.num_splits, a.min_keys_per_split, a.max_splits);
  const int begin = lo + split * per;
  const int end = min(begin + per, pos + 1);
  if (begin >= end) return;  // a split this sequence does not use: pass 2 does not read it

  extern __shared__ __align__(16) uint8_t smem[];
  using Bf16Tile = __nv_bfloat16[kTileKeys][kPitch];
  using CodeTile = uint8_t[kTileKeys][kKvFp8RowBytes];
  Bf16Tile* k_s = reinterpret_cast<Bf16Tile*>(smem);
  Bf16Tile* v_s = reinterpret_cast<Bf16Tile*>(smem + kStages * Smem::kBf16Tile);
  CodeTile* k8_s = reinterpret_cast<CodeTile*>(smem + 2 * kStages * Smem::kBf16Tile);
  CodeTile* v8_s = reinterpret_cast<CodeTile*>(smem + 2 * kStages * Smem::kBf16Tile + kRing * Smem::kCodeTile);
  DecodeMerge& merge = *reinterpret_cast<DecodeMerge*>(smem);  // after the last tile
  __shared__ bool valid_s[kRing][kTileKeys];
  // The split's pool blocks (its first kBlockCache logical blocks), looked up once before the first
  // tile: the tile loop's and the query row's lookups then read shared memory, not the table in L2 (a
  // dependent L2 load each tile, and one before the row of `pos` could be requested, after the PDL
  // wait). Measured alone (DISABLED_DecodeTiming): one CTA over 1,024 keys 24.2 against 25.7 us, a full
  // layer at 32k 27.8 against 30.4; within noise in a decode step. Keys past the cache (splits of more
  // than kBlockCache blocks: small grids only) look the table up as before.
  __shared__ int32_t block_s[kBlockCache];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  // Key j's logical block and its row in it: a shift and a mask for power-of-two block sizes (the
  // server's 16), which every tile needs for each of its rows; a division only for other sizes.
  const int bs = kPlain ? kDecodePlainBlockSize : a.plan.block_size;
  const int bs_shift = kPlain ? kDecodePlainBlockShift : (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1;
  auto block_of_key = [&](int j) { return bs_shift >= 0 ? j >> bs_shift : j / bs; };
  // The tables are uploaded before the step (no kernel of it writes them): read before the PDL wait.
  const int first_block = block_of_key(begin);
  const int cached_blocks = cache_split_blocks ? min(block_of_key(end - 1) - first_block + 1, kBlockCache) : 0;
  for (int i = tid; i < cached_blocks; i += kThreads) block_s[i] = kv_block_of(a, seq, first_block + i);
  __syncthreads();
  auto row_offset = [&](int j) -> int64_t {
    const int i = block_of_key(j) - first_block;
    return i < cached_blocks ? kv_row_offset_in(a, kv_head, block_s[i], j, bs) : kv_row_offset(a, seq, kv_head, j, bs);
  };
  // Key j's cache row (its element offset / 64), -1 when masked; the tile loop's form of row_offset:
  // 32-bit arithmetic (a layer's pool holds < 2^31 rows) from the cached block.
  auto row_index = [&](int j) -> int32_t {
    const int b = block_of_key(j), i = b - first_block;
    if (i >= cached_blocks) return int32_t(kv_row_offset(a, seq, kv_head, j, bs) >> 6);  // -1 >> 6 = -1
    const int block = block_s[i];
    return block < 0 ? -1 : (block * a.num_kv_heads + kv_head) * bs + (j - b * bs);
  };
  float scale_log2 = a.sm_scale * kLog2e;
  if constexpr (kFp8) scale_log2 *= a.k_scale[kv_head];  // q.(code x s) = s (q.code)

  // Tile loader: a row is kRowChunks 16-byte chunks (8 bf16, 4 fp8); thread copies chunk
  // tid % kRowChunks of rows tid / kRowChunks + kLoadRows i, K and V. Keys past the slice or outside
  // the block table are zero-filled and marked invalid (masked). The row of key `skip` is left for
  // load_key_row (it is written by the kernel before this one).
  using Elem = std::conditional_t<kFp8, uint8_t, uint16_t>;
  constexpr int kChunkElems = 16 / int(sizeof(Elem));
  constexpr int kRowChunks = kD / kChunkElems, kLoadRows = kThreads / kRowChunks;
  const Elem* k_cache = static_cast<const Elem*>(a.k_cache);
  const Elem* v_cache = static_cast<const Elem*>(a.v_cache);
  const int load_row = tid / kRowChunks, load_chunk = (tid % kRowChunks) * kChunkElems;
  auto copy_row = [&](int stage, int r, int64_t off, int chunk) {
    const bool ok = off >= 0;
    const Elem* k_src = ok ? k_cache + off + chunk : k_cache;
    const Elem* v_src = ok ? v_cache + off + chunk : v_cache;
    if constexpr (kFp8) {
      const uint32_t at = code_tile_offset(r, chunk / kChunkElems);
      cp_async_16(&k8_s[stage][0][0] + at, k_src, ok);
      cp_async_16(&v8_s[stage][0][0] + at, v_src, ok);
    } else {
      cp_async_16(&k_s[stage][r][chunk], k_src, ok);
      cp_async_16(&v_s[stage][r][chunk], v_src, ok);
    }
  };
  // A tile's rows for this thread: their cache offsets (block-table reads) apart from the copies, so
  // the loop looks up tile t + kRing while tile t computes and issues its copies without waiting on
  // the table's L2 latency.
  constexpr int kRowsPerThread = kTileKeys / kLoadRows;
  struct TileRows {
    int32_t row[kRowsPerThread];  // cache row (offset / 64; a layer's pool holds < 2^31 rows), -1 masked
  };
  // The loads were a third of the kernel's instructions at 256 sequences (ncu, docs/kernels.md,
  // "Decode attention at 64-256 sequences"), so per row they do only what differs from row to row.
  // With kLoadRows a multiple of the block size (the server's 16-token blocks: 16 bf16 rows a pass,
  // 32 fp8 ones), a thread's rows of a tile sit at the same place in blocks kLoadRows / bs apart: one
  // block lookup in shared memory and one multiply-add a row (row_index's arithmetic).
  const bool rows_by_block = bs_shift >= 0 && (kLoadRows & (bs - 1)) == 0;
  const int head_rows = kv_head * bs, block_rows = a.num_kv_heads * bs;
  auto tile_rows = [&](int key0) {
    TileRows rows;
    const int j0 = key0 + load_row;
    if (rows_by_block) {
      const int b0 = j0 >> bs_shift, step = kLoadRows >> bs_shift;
      const int in_block = head_rows + (j0 & (bs - 1));
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int j = j0 + kLoadRows * i, bi = b0 - first_block + step * i;
        int32_t row = -1;
        if (j < end) {
          if (bi < cached_blocks) {
            const int block = block_s[bi];
            row = block < 0 ? -1 : block * block_rows + in_block;
          } else {
            row = row_index(j);
          }
        }
        rows.row[i] = row;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int j = j0 + kLoadRows * i;
        rows.row[i] = j < end ? row_index(j) : -1;
      }
    }
    return rows;
  };
  // This thread's copies: the shared-memory destination computed once and stepped by constants per
  // row and stage, the cache source one multiply-add from the row (the generic-to-shared conversion
  // and 64-bit address arithmetic of copy_row, per copy, were most of the loads' instructions).
  constexpr uint32_t kStageBytes = kFp8 ? uint32_t(Smem::kCodeTile) : uint32_t(Smem::kBf16Tile);
  constexpr uint32_t kPassBytes = kLoadRows * (kFp8 ? kKvFp8RowBytes : kPitch * sizeof(__nv_bfloat16));
  // The V ring follows the K ring at a fixed distance, so one register holds both destinations.
  constexpr uint32_t kVBytes = kFp8 ? kRing * uint32_t(Smem::kCodeTile) : kStages * uint32_t(Smem::kBf16Tile);
  uint32_t dst0;
  static_assert(!kFp8 || kLoadRows % 16 == 0, "rows load_row + kLoadRows i share load_row's placement");
  if constexpr (kFp8)  // (code_tile_offset depends on bits 0-3 of the row only)
    dst0 = static_cast<uint32_t>(__cvta_generic_to_shared(&k8_s[0][0][0])) +
           code_tile_offset(load_row, load_chunk / kChunkElems);
  else
    dst0 = static_cast<uint32_t>(__cvta_generic_to_shared(&k_s[0][load_row][load_chunk]));
  auto issue_tile = [&](int stage, int key0, const TileRows& rows, int skip) {
    const int skip_pass = skip - key0 - load_row;  // kLoadRows * i of the row to leave out, if any
    const uint32_t dst = dst0 + stage * kStageBytes;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int32_t row = rows.row[i];
      if (kLoadRows * i != skip_pass) {
        const bool ok = row >= 0;  // -1: zero-filled, masked
        const int64_t off = (ok ? int64_t(row) * kD : 0) + load_chunk;
        cp_async_16_to(dst + i * kPassBytes, k_cache + off, ok);
        cp_async_16_to(dst + kVBytes + i * kPassBytes, v_cache + off, ok);
      }
      if (load_chunk == 0) valid_s[stage][load_row + kLoadRows * i] = row >= 0;
    }
  };
  auto load_tile = [&](int stage, int key0, int skip) { issue_tile(stage, key0, tile_rows(key0), skip); };
  // Key j's row (in the tile starting at key0) by the first kRowChunks threads.
  auto load_key_row = [&](int stage, int key0, int j) {
    if (tid < kRowChunks) copy_row(stage, j - key0, row_offset(j), tid * kChunkElems);
  };

  const int tiles = (end - begin + kTileKeys - 1) / kTileKeys;
  const bool has_pos = end == pos + 1;  // the slice ends at the query's own key
  const int pos_tile = (pos - begin) / kTileKeys;
  // Prologue: tiles 0 .. kRing - 2, one cp.async group each, then a group for the row of pos.
  if (kv_after_wait) {  // rows of this step's other tokens may precede pos: all after the wait
    pdl_wait();
    pdl_launch_dependents();
#pragma unroll
    for (int t = 0; t < kRing - 1; ++t) {
      if (t < tiles) load_tile(t, begin + t * kTileKeys, -1);
      cp_async_commit();
    }
  } else {
#pragma unroll
    for (int t = 0; t < kRing - 1; ++t) {
      if (t < tiles) load_tile(t, begin + t * kTileKeys, pos);
      cp_async_commit();
    }
    pdl_wait();  // q and the row of `pos` come from the kernel before
    pdl_launch_dependents();
    if (has_pos && pos_tile < kRing - 1) load_key_row(pos_tile, begin + pos_tile * kTileKeys, pos);
  }
  cp_async_commit();  // (the row of pos; empty with kv_after_wait) kRing groups either way

  // Q^T fragments (B operand, k = 16 dims x n = 8 heads, per k step): column g = query head g of this
  // KV head. The scores are computed as S^T = K Q^T (keys on the MMA's 16 rows, the 8 heads on its 8
  // columns), so no MMA row is wasted: S = Q K^T with the 8 heads as rows left rows 8-15 zero (half of
  // each MMA and 24 registers of zeros).
  uint32_t qb[kD / 16][2];
  if constexpr (kFp8) {
    // f16, in fp8_s_row_key's dim order: thread (g, c) holds dims 16c..16c+15 of head g, slots
    // 2c, 2c+1 / 2c+8, 2c+9 of k step kk being dims 16c + 4kk + 0, 1 / 2, 3.
    const uint16_t* q = a.qkv + int64_t(seq.token_begin) * a.qkv_row_stride + (kv_head * kGroup + g) * kD + 16 * c;
    const uint4 q0 = *reinterpret_cast<const uint4*>(q), q1 = *reinterpret_cast<const uint4*>(q + 8);
    const uint32_t w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    float abs_max = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float2 f = unpack_bf16x2(w[i]);
      abs_max = fmaxf(abs_max, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) abs_max = fmaxf(abs_max, __shfl_xor_sync(0xffffffffu, abs_max, o));
    const int shift = decode_q_f16_shift(abs_max);  // every warp and lane the same
    const float down = __uint_as_float(uint32_t(127 - shift) << 23);
    scale_log2 *= __uint_as_float(uint32_t(127 + shift) << 23);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const float2 lo = unpack_bf16x2(w[2 * kk]), hi = unpack_bf16x2(w[2 * kk + 1]);
      qb[kk][0] = pack_f16x2(lo.x * down, lo.y * down);
      qb[kk][1] = pack_f16x2(hi.x * down, hi.y * down);
    }
  } else {
    const uint16_t* q = a.qkv + int64_t(seq.token_begin) * a.qkv_row_stride + (kv_head * kGroup + g) * kD;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      qb[kk][0] = *reinterpret_cast<const uint32_t*>(q + kk * 16 + 2 * c);
      qb[kk][1] = *reinterpret_cast<const uint32_t*>(q + kk * 16 + 8 + 2 * c);
    }
  }

  TileRows next_rows = tile_rows(begin + (kRing - 1) * kTileKeys);  // rows past `end`: -1, never read
  // Thread (g, c) follows heads 2c and 2c + 1: their running maxima (log2 domain; the same in every
  // lane of a c) and this thread's partial sums (its MMA rows g and g + 8 of each tile).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // O^T: MMA rows g (elements 0, 1) and g + 8 (2, 3) of m step dm, heads 2c, 2c + 1; the rows are
  // dims 16 dm + g and + 8 (bf16), 8g + 2dm and + 1 (fp8).
  float acc[kD / 16][4] = {};
  for (int t = 0; t < tiles; ++t) {
    // Tile t + kRing - 1 goes into the stage tile t - 1 used (free since the last iteration's
    // closing barrier). Tile 0 waits for the prologue's groups (the row of pos among them) and lets
    // only the group just committed run on; tile t >= 1 was requested before the newest
    // kRing - 1 groups, and the prologue's others were complete at tile 0.
    if (t + kRing - 1 < tiles) {
      issue_tile((t + kRing - 1) % kRing, begin + (t + kRing - 1) * kTileKeys, next_rows, -1);
      if (t + kRing < tiles) next_rows = tile_rows(begin + (t + kRing) * kTileKeys);
    }
    cp_async_commit();  // possibly empty group, keeps the wait count uniform
    if (t == 0)
      cp_async_wait<1>();
    else
      cp_async_wait<kRing - 1>();
    __syncthreads();
    const int ring = t % kRing;
    const int row0 = warp * kWarpKeys;

    // S^T = K Q^T for this warp's 16 keys, four k steps of 16 dims. bf16: K's rows from ldmatrix
    // (matrices: keys 0-7 / 8-15 x dims 0-7 / 8-15 of the k step); fp8: MMA rows g and g + 8 are keys
    // key_lo and key_lo + 2 (fp8_s_row_key), their dims 16c..16c+15 one 16-byte load each.
    float s[4] = {};  // MMA rows g (0, 1) and g + 8 (2, 3) of the warp's 16 keys, heads 2c (0, 2) and 2c + 1 (1, 3)
    const int key_lo = row0 + (kFp8 ? fp8_s_row_key(g) : g), key_hi = key_lo + (kFp8 ? 2 : 8);
    if constexpr (kFp8) {
      const uint8_t* tile = &k8_s[ring][0][0];
      const uint4 lo = *reinterpret_cast<const uint4*>(tile + code_tile_offset(key_lo, c));
      const uint4 hi = *reinterpret_cast<const uint4*>(tile + code_tile_offset(key_hi, c));
      const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w}, wh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t ka[4] = {e4m3x2_to_f16x2<false>(wl[kk]), e4m3x2_to_f16x2<false>(wh[kk]),
                                e4m3x2_to_f16x2<true>(wl[kk]), e4m3x2_to_f16x2<true>(wh[kk])};
        mma_f16_m16n8k16(s, ka, qb[kk]);
      }
    } else {
      const int mat = lane / 8, mat_row = lane % 8;  // ldmatrix's row addresses
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t ka[4];
        ldmatrix_x4(ka, &k_s[ring][row0 + (mat & 1) * 8 + mat_row][kk * 16 + (mat >> 1) * 8]);
        mma_bf16_m16n8k16(s, ka, qb[kk]);
      }
    }
    const bool ok_lo = valid_s[ring][key_lo], ok_hi = valid_s[ring][key_hi];
    s[0] = ok_lo ? s[0] * scale_log2 : -INFINITY;
    s[1] = ok_lo ? s[1] * scale_log2 : -INFINITY;
    s[2] = ok_hi ? s[2] * scale_log2 : -INFINITY;
    s[3] = ok_hi ? s[3] * scale_log2 : -INFINITY;
    float alpha[2], p[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = fmaxf(s[h], s[2 + h]);  // over the 8 lanes of this c: keys g and g + 8, g = 0..7
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 4));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 8));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 16));
      const float m_new = fmaxf(m[h], tile_max);
      // m_new is -inf only while every key so far was masked; keep p = 0 and skip the rescale then.
      alpha[h] = m_new == -INFINITY ? 1.f : exp2f(m[h] - m_new);
      p[h] = m_new == -INFINITY ? 0.f : exp2f(s[h] - m_new);
      p[2 + h] = m_new == -INFINITY ? 0.f : exp2f(s[2 + h] - m_new);
      m[h] = m_new;
      l[h] = l[h] * alpha[h] + (p[h] + p[2 + h]);
    }
#pragma unroll
    for (int dm = 0; dm < kD / 16; ++dm) {
      acc[dm][0] *= alpha[0], acc[dm][1] *= alpha[1];
      acc[dm][2] *= alpha[0], acc[dm][3] *= alpha[1];
    }

    // O^T += V^T P^T: P^T is the B operand (k = 16 keys x n = 8 heads). Thread (g, c) holds P in the
    // accumulator layout (key g / g + 8, heads 2c, 2c + 1); one transposing move of each 8 x 8 half
    // gives it keys 2c, 2c + 1 (/ + 8) of head g, the B fragment. V^T's A fragments from ldmatrix.trans
    // (matrices: keys 0-7 / 8-15 x dims 0-7 / 8-15 of the m tile).
    // fp8: P^T in f16, keys 4c, 4c+1 / 4c+2, 4c+3 in the B fragment's slots (fp8_s_row_key); V^T's
    // A fragment of m step dm pairs keys 4c, 4c+1 (/ 4c+2, 4c+3) of dims 8g + 2dm (row g) and
    // 8g + 2dm + 1 (row g + 8), from this thread's 8-byte loads of those four keys at dims 8g..8g+7.
    if constexpr (kFp8) {
      const uint32_t pb[2] = {movmatrix_trans(pack_f16x2(p[0], p[1])), movmatrix_trans(pack_f16x2(p[2], p[3]))};
      const uint8_t* tile = &v8_s[ring][0][0];
      uint2 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[j] = *reinterpret_cast<const uint2*>(tile + code_tile_offset(row0 + 4 * c + j, g >> 1) + 8 * (g & 1));
#pragma unroll
      for (int dm = 0; dm < kD / 16; ++dm) {
        // Bytes 2 (dm % 2), + 1 of word dm / 2 of keys j and j + 1, interleaved: key j's dim, key j+1's,
        // then the next dim's pair.
        const uint32_t sel = dm % 2 == 0 ? 0x5140u : 0x7362u;
        const uint32_t w0 = dm < 2 ? v[0].x : v[0].y, w1 = dm < 2 ? v[1].x : v[1].y;
        const uint32_t w2 = dm < 2 ? v[2].x : v[2].y, w3 = dm < 2 ? v[3].x : v[3].y;
        const uint32_t k01 = __byte_perm(w0, w1, sel), k23 = __byte_perm(w2, w3, sel);
        const uint32_t va[4] = {e4m3x2_to_f16x2<false>(k01), e4m3x2_to_f16x2<true>(k01), e4m3x2_to_f16x2<false>(k23),
                                e4m3x2_to_f16x2<true>(k23)};
        mma_f16_m16n8k16(acc[dm], va, pb);
      }
    } else {
      const uint32_t pb[2] = {movmatrix_trans(pack_bf16x2(p[0], p[1])), movmatrix_trans(pack_bf16x2(p[2], p[3]))};
      const int mat = lane / 8, mat_row = lane % 8;
#pragma unroll
      for (int dm = 0; dm < kD / 16; ++dm) {
        uint32_t va[4];
        ldmatrix_x4_trans(va, &v_s[ring][row0 + (mat >> 1) * 8 + mat_row][dm * 16 + (mat & 1) * 8]);
        mma_bf16_m16n8k16(acc[dm], va, pb);
      }
    }
    __syncthreads();  // the next iteration's cp.async overwrites this stage
  }

  // Merge the 4 warps' states, then write this split's partial per head.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 4);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 8);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 16);
  }
  // The ring is free: every requested tile was waited for and read before the last barrier.
  if (g == 0) {
    merge.m[warp][2 * c] = m[0], merge.m[warp][2 * c + 1] = m[1];
    merge.l[warp][2 * c] = l[0], merge.l[warp][2 * c + 1] = l[1];
  }
#pragma unroll
  for (int dm = 0; dm < kD / 16; ++dm) {
    // O^T's MMA rows g, g + 8 of m step dm: dims 16 dm + g, + 8 (bf16); 8g + 2dm, + 1 (fp8).
    const int d_lo = kFp8 ? 8 * g + 2 * dm : dm * 16 + g, d_hi = d_lo + (kFp8 ? 1 : 8);
    merge.acc[warp][2 * c][d_lo] = acc[dm][0];
    merge.acc[warp][2 * c + 1][d_lo] = acc[dm][1];
    merge.acc[warp][2 * c][d_hi] = acc[dm][2];
    merge.acc[warp][2 * c + 1][d_hi] = acc[dm][3];
  }
  __syncthreads();
  const DecodePartials part = decode_partials(a.workspace, a.plan.num_seqs, a.num_q_heads, a.num_splits);
  float v_scale = 1.f;
  if constexpr (kFp8) v_scale = a.v_scale[kv_head];  // P.(code x s) = s (P.code)
  const int used = used_splits(pos - lo + 1, a.num_splits, a.min_keys_per_split, a.max_splits);
  // One split (window layers, short contexts) with the folded merge: merge_heads_splits's arithmetic
  // on this CTA's one partial, straight from registers (the same operations in the same order, so the
  // same bits), without the workspace round trip, fences and ticket.
  const bool alone = used == 1 && a.tickets != nullptr;
  for (int i = tid; i < kGroup * kD; i += kThreads) {
    const int h = i / kD, d = i % kD;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, merge.m[w][h]);
    float lsum = 0.f, o = 0.f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(merge.m[w][h] - mx);
        lsum += merge.l[w][h] * f;
        o += merge.acc[w][h][d] * f;
      }
    }
    if constexpr (kFp8) o *= v_scale;
    if (alone) {
      const int head = kv_head * kGroup + h;
      const float sink_log2 = bf16_bits_to_float(a.sinks[head]) * kLog2e;
      const float top = fmaxf(sink_log2, mx);
      const float f = exp2f(mx - top);  // mx = -inf (every key masked): 0
      float denom = exp2f(sink_log2 - top);
      denom += __fmul_rn(lsum, f);  // rounded product, as merge_heads_splits's weighted sum
      const float out = (0.f + o * f) / denom;
      reinterpret_cast<__nv_bfloat16*>(a.out)[int64_t(seq.token_begin) * a.num_q_heads * kD + head * kD + d] =
          __float2bfloat16_rn(out);
      continue;
    }
    const int64_t state = (int64_t(seq_index) * a.num_q_heads + kv_head * kGroup + h) * a.num_splits + split;
    part.acc[state * kD + d] = o;
    if (d == 0) part.m[state] = mx, part.l[state] = lsum;
  }
  if (a.tickets == nullptr || alone) return;  // pass 2 merges, or this CTA did

  // Folded merge: the last of the sequence's used splits of this KV head merges its 8 heads (one
  // warp per 2 heads), with pass 2's arithmetic, and resets the ticket.
  __shared__ bool last_s;
  __threadfence();  // this split's partials, device-wide, before its ticket
  __syncthreads();
  int32_t* ticket = a.tickets + int64_t(seq_index) * a.num_kv_heads + kv_head;
  if (tid == 0) last_s = atomicAdd(ticket, 1) == used - 1;
  __syncthreads();
  if (!last_s) return;
  __threadfence();  // the other splits' partials, after their tickets
  static_assert(kGroup == 2 * kWarps, "each warp merges two heads");
  merge_heads_splits<2>(a, seq, seq_index, kv_head * kGroup + warp, kWarps, used, lane);
  if (tid == 0) *ticket = 0;  // ready for the next launch
}

// One warp per query head; lane i owns dims 2i, 2i+1.
__global__ void __launch_bounds__(kGroup * 32) bf16_sdpa_sinks_d64_decode_combine(AttentionArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int seq_index = blockIdx.x;
  const SeqStep seq = a.plan.seqs[seq_index];
  if (seq.num_tokens != 1) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = seq.context_begin - first_visible_key(seq.context_begin, a.window) + 1;
  merge_heads_splits<1>(a, seq, seq_index, blockIdx.y * kGroup + warp, 0,
                        used_splits(n, a.num_splits, a.min_keys_per_split, a.max_splits), lane);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The ring's shared memory is over the 48 KB a kernel gets without asking: the limit is raised on
// each device before its first launch there (attention_decode_prepare, called by the backend at
// start, so never inside a graph capture; the launcher calls it too for direct callers).
template <KvCacheElem kElem, int kRing, DecodeForm kForm>
void prepare_decode_form() {
  static PerDeviceOnce raised;
  OSSRT_CUDA_CALL(raised.run([] {
    return cudaFuncSetAttribute(bf16_sdpa_sinks_d64_decode<kElem, kRing, kForm>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, int(DecodeSmem<kElem, kRing>::kBytes));
  }));
}

template <KvCacheElem kElem, int kRing>
void prepare_decode() {
  prepare_decode_form<kElem, kRing, DecodeForm::kGeneric>();
  prepare_decode_form<kElem, kRing, DecodeForm::kPlainBlock16>();
}

template <KvCacheElem kElem, int kRing, DecodeForm kForm>
void launch_decode_form(dim3 grid, cudaStream_t stream, const AttentionArgs& args) {
  prepare_decode_form<kElem, kRing, kForm>();
  OSSRT_CUDA_CALL(launch_pdl_smem(bf16_sdpa_sinks_d64_decode<kElem, kRing, kForm>, grid, dim3(kThreads),
                                  DecodeSmem<kElem, kRing>::kBytes, stream, args));
}

template <KvCacheElem kElem, int kRing>
void launch_decode(dim3 grid, cudaStream_t stream, const AttentionArgs& args) {
  if (attention_decode_plain_form(args))
    launch_decode_form<kElem, kRing, DecodeForm::kPlainBlock16>(grid, stream, args);
  else
    launch_decode_form<kElem, kRing, DecodeForm::kGeneric>(grid, stream, args);
}

}  // namespace

bool attention_decode_plain_form(const AttentionArgs& a) {
  return a.decode_plain_form && a.plan.block_size == kDecodePlainBlockSize && a.cache_split_blocks && !a.kv_after_wait;
}

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
  OSSRT_CU_CHECK(a.kv_elem == KvCacheElem::Bf16 || (a.k_scale && a.v_scale),
                 "attention: an fp8 KV cache needs its K and V scales");
}

int attention_decode_splits(int num_seqs, int num_kv_heads, int max_context, int num_sms, int min_keys_per_split,
                            int max_splits) {
  // Only the context decides: each sequence slices its keys by its own length (split_range), so
  // the grid needs as many splits as the longest context uses. Batch size and SM count do not
  // enter, which keeps results independent of the batch.
  (void)num_seqs, (void)num_kv_heads, (void)num_sms;
  const int needed = (std::max(max_context, 1) + min_keys_per_split - 1) / min_keys_per_split;
  return std::clamp(needed, 1, std::clamp(max_splits, 1, kAttnMaxDecodeSplits));
}

int attention_decode_min_split_keys(int num_seqs) {
  // gpt-oss-20b mxfp4, context 1k, bench cost decode steps (2026-12-04): 128 keys 1.79-1.80 ms against
  // 1.83-1.84 at batch 1, 3.94-3.97 against 3.96-3.99 at 8, 7.62-7.65 against 7.39-7.45 at 64.
  // From 64 sequences the grid fills the GPU without splitting and each split's fixed cost (its block
  // table, first tile, partials, fence and ticket) is what more splits add: the kernel alone, contexts
  // 1k..2k (attention_test DISABLED_DecodeTimingManySequences, H100, session 31): 64 sequences 85.1 us
  // at 512 keys against 90.7 at 256, 128: 155.2 against 173.2, 256: 301.9 against 337.2 (1,024 keys
  // 300.1); at 1k contexts and 256 sequences 1,024 keys 189.1 against 205.2 (512) and 221.0 (256).
  if (num_seqs <= kAttnSmallBatchSeqs) return 128;
  if (num_seqs < kAttnManySeqs) return kAttnDefaultMinKeysPerSplit;
  return num_seqs < 4 * kAttnManySeqs ? 2 * kAttnDefaultMinKeysPerSplit : 4 * kAttnDefaultMinKeysPerSplit;
}

int attention_decode_ring(int num_seqs, int num_kv_heads, int num_splits, int num_sms, KvCacheElem elem) {
  // Measured (docs/kernels.md, "Decode"): a deep ring pays where the grid is a few CTAs an SM (one
  // long sequence: each CTA's loads in flight set the bandwidth); with more CTAs than 3 an SM, the
  // 5-6 CTAs an SM that a 2-tile ring's shared memory allows beat 3 CTAs of 4 tiles. An fp8 tile is
  // half a bf16 one's bytes, and its 4-tile ring is built for 6 CTAs an SM too (kDecodeCtasPerSm).
  // Between 3 and 4 CTAs an SM (one long bf16 sequence's 64 splits: 512 CTAs on 132 SMs) the 3-tile
  // ring keeps every CTA resident with two tiles in flight: a 32k full layer alone 29.7 us against
  // 35.6 (2 tiles) and 34.1 (4 tiles, a second wave); a 20b `mxfp4-fp8` decode step at 32k 2.04-2.05
  // ms against 2.08-2.10 (H100, session 40, bench/results/20261207_session40_h100_ring3/).
  const int64_t ctas = int64_t(num_seqs) * num_kv_heads * num_splits;
  if (ctas <= 3 * int64_t(num_sms) || elem == KvCacheElem::Fp8E4m3) return 4;
  return ctas <= 4 * int64_t(num_sms) ? 3 : 2;
}

void attention_decode_prepare() {
  prepare_decode<KvCacheElem::Bf16, 2>();
  prepare_decode<KvCacheElem::Bf16, 3>();
  prepare_decode<KvCacheElem::Bf16, 4>();
  prepare_decode<KvCacheElem::Bf16, 6>();
  prepare_decode<KvCacheElem::Fp8E4m3, 2>();
  prepare_decode<KvCacheElem::Fp8E4m3, 3>();
  prepare_decode<KvCacheElem::Fp8E4m3, 4>();
  prepare_decode<KvCacheElem::Fp8E4m3, 6>();
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
  OSSRT_CU_CHECK(a.max_splits >= 1 && a.max_splits <= kAttnMaxDecodeSplits, "attention decode: max_splits ",
                 a.max_splits, " not in [1, ", kAttnMaxDecodeSplits, "]");
  OSSRT_CU_CHECK(a.min_keys_per_split >= kTileKeys && a.min_keys_per_split % kTileKeys == 0,
                 "attention decode: min_keys_per_split ", a.min_keys_per_split, " must be a positive multiple of ",
                 kTileKeys);
  OSSRT_CU_CHECK(a.decode_ring == 0 || is_decode_ring(a.decode_ring), "attention decode: decode_ring ", a.decode_ring,
                 " is not 0 (auto), 2, 3, 4 or 6");
  const size_t need = attention_decode_workspace_bytes(a.plan.num_seqs, a.num_q_heads, a.num_splits);
  OSSRT_CU_CHECK(a.workspace && a.workspace_bytes >= need && aligned16(a.workspace), "attention decode: workspace of ",
                 need, " bytes (16-byte aligned) needed, ", a.workspace_bytes, " given");
  AttentionArgs args = a;
  if (args.tickets_capacity < int64_t(a.plan.num_seqs) * a.num_kv_heads) args.tickets = nullptr;  // too few: pass 2
  const dim3 grid(a.num_splits, a.num_kv_heads, a.plan.num_seqs);
  const int ring = a.decode_ring != 0
                       ? a.decode_ring
                       : attention_decode_ring(a.plan.num_seqs, a.num_kv_heads, a.num_splits, 132, a.kv_elem);
  if (a.kv_elem == KvCacheElem::Fp8E4m3) {
    switch (ring) {
      case 2: launch_decode<KvCacheElem::Fp8E4m3, 2>(grid, stream, args); break;
      case 3: launch_decode<KvCacheElem::Fp8E4m3, 3>(grid, stream, args); break;
      case 4: launch_decode<KvCacheElem::Fp8E4m3, 4>(grid, stream, args); break;
      default: launch_decode<KvCacheElem::Fp8E4m3, 6>(grid, stream, args); break;
    }
  } else {
    switch (ring) {
      case 2: launch_decode<KvCacheElem::Bf16, 2>(grid, stream, args); break;
      case 3: launch_decode<KvCacheElem::Bf16, 3>(grid, stream, args); break;
      case 4: launch_decode<KvCacheElem::Bf16, 4>(grid, stream, args); break;
      default: launch_decode<KvCacheElem::Bf16, 6>(grid, stream, args); break;
    }
  }
  if (args.tickets == nullptr)
    OSSRT_CUDA_CALL(launch_pdl(bf16_sdpa_sinks_d64_decode_combine, dim3(a.plan.num_seqs, a.num_kv_heads),
                               dim3(kGroup * 32), stream, args));
}

void launch_bf16_sdpa_sinks_d64(const AttentionArgs& a, cudaStream_t stream) {
  if (a.plan.max_seq_tokens == 1)
    launch_bf16_sdpa_sinks_d64_decode(a, stream);
  else
    launch_bf16_sdpa_sinks_d64_prefill(a, stream);
}

}  // namespace ossrt::cuda
