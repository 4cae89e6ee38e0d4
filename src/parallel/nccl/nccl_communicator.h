#pragma once
// NCCL collectives for one process driving several GPUs (docs/parallel.md): a clique made once with
// ncclCommInitAll over a device list, one Communicator per device, each enqueuing on the queue of
// that device's backend (Backend::device_queue) so the collectives are ordered with the backend's
// kernels. Each rank's calls come from its own host thread (ParallelModel's rank threads), which NCCL
// allows for one communicator per thread. Built only with CUDA and NCCL (OSSRT_WITH_NCCL). F32 and
// BF16 tensors.
//
// NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set before the clique is made unless
// the user set it (the lent H200 machines do not support it; see the device notes).
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"

namespace ossrt {

// Devices visible to this process (0 when the CUDA runtime finds none or fails).
int cuda_device_count();

// One communicator per entry of `queues` (rank i on queues[i].device, enqueuing on its stream).
// all_gather_columns needs a staging buffer of its output size; each communicator allocates one
// of `max_gather_bytes` at creation (the vocab-parallel logits: max_logit_rows x vocab x 4).
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const Backend::DeviceQueue> queues,
                                                                   size_t max_gather_bytes);

}  // namespace ossrt
