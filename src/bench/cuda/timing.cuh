#pragma once
// The kernel benchmark's own device helpers (nvcc-compiled; no fmt here, as in the backend's .cu).
#include <cuda_runtime_api.h>

#include <cstddef>

namespace ossrt::bench::cuda {

// Reads `bytes` of `buffer` (a multiple of 16) so that L2 holds only those lines, clean: the op
// timed next finds none of its inputs in L2. `sink` gets a value so the reads are not elided.
cudaError_t launch_l2_flush(const void* buffer, size_t bytes, unsigned* sink, cudaStream_t stream);
// One thread that waits `nanoseconds` (globaltimer): queued before a timed op, it keeps the GPU
// busy while the host enqueues the op's launches, so the start event and the op's kernels run back
// to back and host launch overhead is not counted.
cudaError_t launch_spin(unsigned long long nanoseconds, cudaStream_t stream);

}  // namespace ossrt::bench::cuda
