#pragma once
// Collectives between the ranks of a sharded model (docs/parallel.md): the communication ops of the
// op interface, next to backend.h because they move backend Tensors. The model (src/model) calls
// them at the points where a sharded forward communicates; the implementations live above it, in
// src/parallel, so the model depends on this interface only:
//   InProcessCommunicator (parallel/in_process_communicator.h): ranks are threads of one process, CPU
//     tensors; the oracle for sharding arithmetic, deterministic (sums in rank order).
//   NcclCommunicator (parallel/nccl/nccl_communicator.h, CUDA builds): one GPU per rank, on that rank's
//     backend queue (Backend::device_queue).
//
// Every call is collective: all ranks of the communicator make the same calls in the same order with
// tensors of the same dtype and sizes, or the call throws ossrt::Error (in-process) / fails (NCCL).
// Tensors are contiguous; only their element counts matter (shapes are the caller's business).
#include "core/tensor.h"

namespace ossrt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // t = sum over ranks of t (in place). Every rank ends with identical values.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // out = in_0 | in_1 | ... | in_{size-1} (concatenated); out has size * in.numel() elements.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // Column-wise gather of row-major matrices: in is [R, C], out is [R, size * C] with
  // out[r, j*C + c] = in_j[r, c]. The vocab-parallel unembedding uses it (each rank holds a vocab slice).
  virtual void all_gather_columns(const Tensor& in, Tensor& out) = 0;
  // in has size * n elements; out (n elements) = sum over ranks j of in_j[rank*n, (rank+1)*n).
  virtual void reduce_scatter_sum(const Tensor& in, Tensor& out) = 0;
  // in and out have size * n elements: out[j*n, (j+1)*n) = in_j[rank*n, (rank+1)*n), i.e. chunk j of
  // `in` goes to rank j and chunk j of `out` came from rank j (MoE token dispatch).
  virtual void all_to_all(const Tensor& in, Tensor& out) = 0;
  // Returns when every rank has called it (host side; NCCL: after the device work queued so far).
  virtual void barrier() = 0;
};

// The same collectives on a group that may be absent: a null communicator, or one of size 1, is a
// group of one rank, where each collective is the identity. The unsharded model passes null, so its
// forward is the same code as every rank's with nothing to exchange.
inline bool is_single_rank(const Communicator* group) { return group == nullptr || group->size() == 1; }
inline void all_reduce_sum(Communicator* group, Tensor& t) {
  if (!is_single_rank(group)) group->all_reduce_sum(t);
}
// Alone, `in` is already the whole of `out`: the caller passes the same view for both.
inline void all_gather_columns(Communicator* group, const Tensor& in, Tensor& out) {
  if (!is_single_rank(group)) return group->all_gather_columns(in, out);
  OSSRT_CHECK(in.data == out.data && in.numel() == out.numel(),
              "all_gather_columns on one rank: in {} must be out {} (the same view)", in.shape_str(), out.shape_str());
}

}  // namespace ossrt
