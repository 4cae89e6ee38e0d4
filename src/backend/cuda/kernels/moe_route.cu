// Routing and combine passes of the grouped MoE.
//
// Grouping uses atomics, so the order of pairs inside one expert's group varies from run to run;
// that order never reaches the numbers: each grouped row is computed by the GEMM on its own (the
// k-loop order does not depend on the row's position in a tile) and the combine reads rows back by
// pair index and sums the k slots in slot order. A token's output is therefore bit-identical
// whatever else is in the batch.
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPlanThreads = 1024;
constexpr int kCombineThreads = 768;

__global__ void moe_count_experts(const int32_t* ids, int pairs, int num_experts, int32_t* counts) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int e = ids[i];
  if (e >= 0 && e < num_experts) atomicAdd(&counts[e], 1);
}

// One CTA: prefix sums over experts (E <= 1024, a serial scan by one thread costs ~1 us) and the
// tile list, written by one thread per expert.
__global__ void __launch_bounds__(kPlanThreads) moe_plan_tiles(int num_experts, int tile_m, MoeWorkspace ws) {
  __shared__ int row_start[kMoeMaxExperts + 1], tile_start[kMoeMaxExperts + 1];
  if (threadIdx.x == 0) {
    int rows = 0, tiles = 0;
    for (int e = 0; e < num_experts; ++e) {
      row_start[e] = rows;
      tile_start[e] = tiles;
      const int count = ws.counts[e];
      rows += count;
      tiles += (count + tile_m - 1) / tile_m;
    }
    row_start[num_experts] = rows;
    tile_start[num_experts] = tiles;
    *ws.num_tiles = tiles;
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) ws.offsets[e] = row_start[e];
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    for (int t = tile_start[e]; t < tile_start[e + 1]; ++t) {
      ws.tile_expert[t] = e;
      ws.tile_row[t] = row_start[e] + (t - tile_start[e]) * tile_m;
    }
  }
}

__global__ void moe_scatter_pairs(const int32_t* ids, int pairs, int num_experts, MoeWorkspace ws) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int e = ids[i];
  if (e < 0 || e >= num_experts) {
    ws.pair_to_pos[i] = -1;  // dropped: contributes nothing, read nowhere
    return;
  }
  const int pos = ws.offsets[e] + atomicAdd(&ws.cursor[e], 1);
  ws.pos_to_pair[pos] = i;
  ws.pair_to_pos[i] = pos;
}

// The whole route in one CTA (decode sizes: pairs <= kSingleCtaPairs): counts, prefix sums (a
// Hillis-Steele scan over the experts), tile list and scatter with shared-memory atomics. One launch
// instead of a memset and three kernels, which at one token cost more than the counting itself.
constexpr int kSingleCtaPairs = 4096;

__global__ void __launch_bounds__(kPlanThreads)
    moe_route_single_cta(const int32_t* ids, int pairs, int num_experts, int tile_m, MoeWorkspace ws) {
  __shared__ int count[kMoeMaxExperts], rows[kMoeMaxExperts + 1], tiles[kMoeMaxExperts + 1];
  __shared__ int scan_a[kMoeMaxExperts], scan_b[kMoeMaxExperts];
  // The first GEMM (PDL-launched) may take its SM slots now; it waits for this kernel's output.
  pdl_launch_dependents();
  pdl_wait();  // launched with PDL too: the ids come from the router kernel before
  const int tid = threadIdx.x;
  for (int e = tid; e < num_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int i = tid; i < pairs; i += blockDim.x) {
    const int e = ids[i];
    if (e >= 0 && e < num_experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  // Inclusive scans over the experts of rows (count) and tiles (ceil(count / tile_m)).
  for (int e = tid; e < num_experts; e += blockDim.x) {
    scan_a[e] = count[e];
    scan_b[e] = (count[e] + tile_m - 1) / tile_m;
  }
  __syncthreads();
  for (int step = 1; step < num_experts; step *= 2) {
    int va = 0, vb = 0;
    const int e = tid;
    if (e < num_experts && e >= step) va = scan_a[e - step], vb = scan_b[e - step];
    __syncthreads();
    if (e < num_experts && e >= step) scan_a[e] += va, scan_b[e] += vb;
    __syncthreads();
  }
  for (int e = tid; e < num_experts; e += blockDim.x) {
    rows[e + 1] = scan_a[e];
    tiles[e + 1] = scan_b[e];
  }
  if (tid == 0) rows[0] = tiles[0] = 0;
  __syncthreads();
  if (tid == 0) *ws.num_tiles = tiles[num_experts];
  for (int e = tid; e <= num_experts; e += blockDim.x) ws.offsets[e] = rows[e];
  for (int e = tid; e < num_experts; e += blockDim.x) {
    for (int t = tiles[e]; t < tiles[e + 1]; ++t) {
      ws.tile_expert[t] = e;
      ws.tile_row[t] = rows[e] + (t - tiles[e]) * tile_m;
    }
    count[e] = 0;  // reused as the scatter cursor
  }
  __syncthreads();
  for (int i = tid; i < pairs; i += blockDim.x) {
    const int e = ids[i];
    if (e < 0 || e >= num_experts) {
      ws.pair_to_pos[i] = -1;
      continue;
    }
    const int pos = rows[e] + atomicAdd(&count[e], 1);
    ws.pos_to_pair[pos] = i;
    ws.pair_to_pos[i] = pos;
  }
}

// One CTA per token; each thread 4 consecutive features (768 threads: one pass over gpt-oss's 2,880,
// since at one token the kernel is latency, not bandwidth).
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine(const float* weights, int top_k, int hidden, MoeWorkspace ws, void* out, bool out_bf16,
                const int32_t* direct_ids, int num_experts) {
  pdl_wait();  // y comes from the kernel before (launched with PDL after the small-M down GEMM)
  const int t = blockIdx.x;
  for (int n = threadIdx.x * 4; n < hidden; n += blockDim.x * 4) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < top_k; ++s) {
      const int pair = t * top_k + s;
      int pos;
      if (direct_ids) {
        const int e = direct_ids[pair];
        pos = e >= 0 && e < num_experts ? pair : -1;
      } else {
        pos = ws.pair_to_pos[pair];
      }
      if (pos < 0) continue;
      const float w = weights[t * top_k + s];
      const float4 y = *reinterpret_cast<const float4*>(ws.y + int64_t(pos) * hidden + n);
      acc.x += w * y.x;
      acc.y += w * y.y;
      acc.z += w * y.z;
      acc.w += w * y.w;
    }
    if (out_bf16) {
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(static_cast<uint16_t*>(out) + int64_t(t) * hidden + n);
      o[0] = __floats2bfloat162_rn(acc.x, acc.y);
      o[1] = __floats2bfloat162_rn(acc.z, acc.w);
    } else {
      *reinterpret_cast<float4*>(static_cast<float*>(out) + int64_t(t) * hidden + n) = acc;
    }
  }
}

}  // namespace

void launch_moe_route(const int32_t* ids, int pairs, int num_experts, const MoeWorkspace& ws, cudaStream_t stream,
                      int tile_m) {
  OSSRT_CU_CHECK(tile_m >= kMoeMinTileM, "moe route: tile of ", tile_m, " rows, the workspace holds tiles of ",
                 kMoeMinTileM, " rows or more");
  if (pairs <= kSingleCtaPairs) {
    OSSRT_CUDA_CALL(
        launch_pdl(moe_route_single_cta, dim3(1), dim3(kPlanThreads), stream, ids, pairs, num_experts, tile_m, ws));
    return;
  }
  OSSRT_CUDA_CALL(cudaMemsetAsync(ws.counts, 0, sizeof(int32_t) * 2 * num_experts, stream));  // counts + cursor
  const int blocks = (pairs + kThreads - 1) / kThreads;
  moe_count_experts<<<blocks, kThreads, 0, stream>>>(ids, pairs, num_experts, ws.counts);
  OSSRT_CHECK_LAUNCH("moe_count_experts");
  moe_plan_tiles<<<1, kPlanThreads, 0, stream>>>(num_experts, tile_m, ws);
  OSSRT_CHECK_LAUNCH("moe_plan_tiles");
  moe_scatter_pairs<<<blocks, kThreads, 0, stream>>>(ids, pairs, num_experts, ws);
  OSSRT_CHECK_LAUNCH("moe_scatter_pairs");
}

void launch_moe_combine(const float* weights, int tokens, int top_k, int hidden, const MoeWorkspace& ws, void* out,
                        bool out_bf16, cudaStream_t stream, const int32_t* direct_ids, int num_experts) {
  OSSRT_CUDA_CALL(launch_pdl(moe_combine, dim3(tokens), dim3(kCombineThreads), stream, weights, top_k, hidden, ws, out,
                             out_bf16, direct_ids, num_experts));
}

}  // namespace ossrt::cuda
