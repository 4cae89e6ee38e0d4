#pragma once
// Greedy decoding's argmax fused into the unembedding GEMV (issue 15: "greedy decoding gets an
// unembedding fused with its argmax"). The GEMV still writes every logit; besides, each of its
// output rows (vocabulary ids) is offered, as one 64-bit key per token row, to an atomic max:
//   key = order(logit) << 32 | ~id,  order() the order-preserving map of a float onto uint32,
// so the largest key is the largest logit and, among equal logits, the lowest id: the device
// sampler's greedy rule (sample.cu: NaN counts as -inf, lowest id on ties), bit for bit, since the
// keys are made from the very floats the GEMV writes. The offers go to kGreedySlots slots a token
// row (a CTA picks slot blockIdx.x % kGreedySlots; each slot on its own L2 line), so some 200k
// atomics do not queue on one L2 address; they are reductions (no return value), so no warp waits
// on them. A one-CTA kernel
// launched after the GEMV (PDL: it waits for the GEMV's completion) takes each row's largest slot,
// writes the id and zeroes the slots for the next launch. The engine's sampler then copies ids
// instead of launching its argmax passes (CudaBackend::unembed, sample_on_device).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ossrt::cuda {

inline constexpr int kGreedySlots = 32;
inline constexpr int kGreedyMaxRows = 8;  // token rows: the decode GEMVs' kGemvMaxRows
// Keys of one slot, all token rows, fill one 128-byte line of their own (slot s, row r at
// s * kGreedySlotStride + r), so the slots' reductions land on different L2 lines.
inline constexpr int kGreedySlotStride = 16;
static_assert(kGreedySlotStride >= kGreedyMaxRows, "a slot's line holds every token row");

struct GreedyArgmaxArgs {
  unsigned long long* keys = nullptr;  // [kGreedySlots][kGreedySlotStride], all 0 before a GEMV launch
  int32_t* ids = nullptr;              // [kGreedyMaxRows]: the argmax of each token row
  int rows = 0;                        // token rows of the GEMV (1..kGreedyMaxRows)
  // Optional: words the finish kernel also zeroes, once every kernel before it has completed (the
  // greedy screen's per-step counters, greedy_screen.cuh).
  uint32_t* zero_after = nullptr;
  int zero_words = 0;
};

inline size_t greedy_argmax_key_bytes() {
  return size_t(kGreedySlots) * kGreedySlotStride * sizeof(unsigned long long);
}

// After a GEMV launched with these keys: ids[r] = the argmax of token row r; every slot back to 0.
void launch_greedy_argmax_finish(const GreedyArgmaxArgs& args, cudaStream_t stream);

#ifdef __CUDACC__
// The key of logit y at vocabulary id `id` (see above). -0.0 is made +0.0 and NaN -inf first, so
// keys compare as the sampler's floats do.
__device__ __forceinline__ unsigned long long greedy_key(float y, int id) {
  float v = y != y ? -INFINITY : y;
  if (v == 0.f) v = 0.f;
  const uint32_t u = __float_as_uint(v);
  const uint32_t order = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(order) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}

// Offers token row r's candidate: an atomic reduction into this CTA's slot.
__device__ __forceinline__ void greedy_offer(const GreedyArgmaxArgs& g, int r, unsigned long long key) {
  atomicMax(g.keys + int(blockIdx.x % kGreedySlots) * kGreedySlotStride + r, key);
}

// The tensor-core GEMVs' last step (their m16n8 tiles: lane = 4 g + c holds tokens token0 + 2c and
// + 1 of rows g and g + 8): best[t] is the lane's best key of token token0 + 2c + t over all its rows;
// the 8 lanes of one c meet by shuffles and lane (0, c) offers the two tokens below m. Every lane of
// the warp calls it.
__device__ __forceinline__ void greedy_offer_token_pairs(const GreedyArgmaxArgs& g, unsigned long long (&best)[2],
                                                         int token0, int m) {
  const int lane = threadIdx.x % 32, c = lane % 4;
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    for (int o = 4; o < 32; o <<= 1) {  // lanes of one c, all g
      const unsigned long long other = __shfl_xor_sync(0xffffffffu, best[t], o);
      if (other > best[t]) best[t] = other;
    }
    if (lane < 4 && token0 + 2 * c + t < m && best[t] != 0) greedy_offer(g, token0 + 2 * c + t, best[t]);
  }
}
#endif

}  // namespace ossrt::cuda
