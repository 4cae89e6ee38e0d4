// The last step of the fused greedy argmax (greedy_argmax.cuh): warp r reduces token row r's
// kGreedySlots keys, lane s taking (and zeroing) slot s.
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/greedy_argmax.cuh"

namespace ossrt::cuda {
namespace {

static_assert(kGreedySlots == 32, "a lane a slot");

__global__ void __launch_bounds__(kGreedyMaxRows * 32) greedy_argmax_finish(GreedyArgmaxArgs a) {
  pdl_wait();  // the GEMV's offers, all of them (its grid has completed)
  pdl_launch_dependents();
  const int r = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Every row's slots are zeroed, used or not, so a launch with more rows finds them clean (the
  // padding between kGreedyMaxRows and kGreedySlotStride is never written).
  unsigned long long key = atomicExch(a.keys + lane * kGreedySlotStride + r, 0ull);
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, key, o);
    key = other > key ? other : key;
  }
  // key 0: no offer (a GEMV of no output rows, which the launcher refuses); -1 says so.
  if (lane == 0 && r < a.rows) a.ids[r] = key == 0 ? -1 : int32_t(~static_cast<uint32_t>(key));
  for (int i = int(threadIdx.x); i < a.zero_words; i += int(blockDim.x)) a.zero_after[i] = 0;
}

}  // namespace

void launch_greedy_argmax_finish(const GreedyArgmaxArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(a.keys && a.ids && a.rows >= 1 && a.rows <= kGreedyMaxRows, "greedy argmax: ", a.rows,
                 " token rows (1..", kGreedyMaxRows, ") or no key / id buffer");
  OSSRT_CU_CHECK(a.zero_words >= 0 && (a.zero_words == 0 || a.zero_after), "greedy argmax: ", a.zero_words,
                 " words to zero without a buffer");
  OSSRT_CUDA_CALL(launch_pdl(greedy_argmax_finish, dim3(1), dim3(kGreedyMaxRows * 32), stream, a));
}

}  // namespace ossrt::cuda
