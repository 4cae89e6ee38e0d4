// NCCL communicator: compile-checked here (no GPUs on the build machine); the CPU in-process
// communicator is the tested oracle of the same interface.
#include "parallel/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>

#include "core/error.h"

namespace ossrt {

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  OSSRT_CHECK(r == ncclSuccess, "NCCL {}: {}", what, ncclGetErrorString(r));
}

void cuda_check(cudaError_t r, const char* what) {
  OSSRT_CHECK(r == cudaSuccess, "CUDA {}: {}", what, cudaGetErrorString(r));
}

ncclDataType_t nccl_type(const Tensor& t, const char* op) {
  OSSRT_CHECK(t.device == Device::CUDA, "{}: the NCCL communicator needs CUDA tensors", op);
  switch (t.dtype) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    default: fail("{}: NCCL communicator handles F32 and BF16, not {}", op, dtype_name(t.dtype));
  }
}

// Makes `device` current for a scope and restores the caller's device after: communicators are made
// and destroyed on the thread that owns the ParallelModel, whose own device must not move.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, cudaStream_t stream, size_t gather_bytes)
      : comm_(comm), rank_(rank), size_(size), device_(device), stream_(stream), gather_bytes_(gather_bytes) {
    DeviceScope on(device_);
    cuda_check(cudaMalloc(&barrier_word_, sizeof(float)), "cudaMalloc (barrier word)");
    if (gather_bytes_ > 0)
      cuda_check(cudaMalloc(&gather_staging_, gather_bytes_), "cudaMalloc (all_gather_columns staging)");
  }
  ~NcclCommunicator() override {
    DeviceScope on(device_);
    if (gather_staging_) cudaFree(gather_staging_);
    cudaFree(barrier_word_);
    ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(Tensor& t) override {
    use_device();
    const ncclDataType_t type = nccl_type(t, "all_reduce_sum");
    nccl_check(ncclAllReduce(t.data, t.data, size_t(t.numel()), type, ncclSum, comm_, stream_), "all_reduce");
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    use_device();
    const ncclDataType_t type = nccl_type(in, "all_gather");
    OSSRT_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * size_, "all_gather: out {} for {} ranks x in {}",
                out.shape_str(), size_, in.shape_str());
    nccl_check(ncclAllGather(in.data, out.data, size_t(in.numel()), type, comm_, stream_), "all_gather");
  }

  void all_gather_columns(const Tensor& in, Tensor& out) override {
    use_device();
    nccl_type(in, "all_gather_columns");
    OSSRT_CHECK(in.ndim == 2 && out.ndim == 2 && out.dtype == in.dtype && out.dim(0) == in.dim(0) &&
                    out.dim(1) == in.dim(1) * size_,
                "all_gather_columns: in {} and out {} do not fit [R, C] -> [R, {} x C]", in.shape_str(),
                out.shape_str(), size_);
    OSSRT_CHECK(out.bytes() <= gather_bytes_, "all_gather_columns: {} bytes, the staging buffer holds {}", out.bytes(),
                gather_bytes_);
    // Gather the [R, C] blocks rank after rank, then lay them side by side: one 2-D copy per rank.
    Tensor staging = out;
    staging.data = gather_staging_;
    all_gather(in, staging);
    const size_t elem = dtype_size(in.dtype), row_bytes = size_t(in.dim(1)) * elem;
    for (int j = 0; j < size_; ++j)
      cuda_check(cudaMemcpy2DAsync(static_cast<char*>(out.data) + size_t(j) * row_bytes, row_bytes * size_t(size_),
                                   static_cast<const char*>(gather_staging_) + size_t(j) * in.bytes(), row_bytes,
                                   row_bytes, size_t(in.dim(0)), cudaMemcpyDeviceToDevice, stream_),
                 "cudaMemcpy2DAsync (all_gather_columns)");
  }

  void reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    use_device();
    const ncclDataType_t type = nccl_type(in, "reduce_scatter_sum");
    OSSRT_CHECK(out.dtype == in.dtype && in.numel() == out.numel() * size_,
                "reduce_scatter_sum: in {} for {} ranks x out {}", in.shape_str(), size_, out.shape_str());
    nccl_check(ncclReduceScatter(in.data, out.data, size_t(out.numel()), type, ncclSum, comm_, stream_),
               "reduce_scatter");
  }

  void all_to_all(const Tensor& in, Tensor& out) override {
    use_device();
    const ncclDataType_t type = nccl_type(in, "all_to_all");
    OSSRT_CHECK(out.dtype == in.dtype && in.numel() == out.numel() && in.numel() % size_ == 0,
                "all_to_all: in {} and out {} must hold the same multiple of {} elements", in.shape_str(),
                out.shape_str(), size_);
    const size_t n = size_t(in.numel() / size_), bytes = n * dtype_size(in.dtype);
    // NCCL has no all-to-all primitive: a group of paired sends and receives.
    nccl_check(ncclGroupStart(), "group start");
    for (int j = 0; j < size_; ++j) {
      nccl_check(ncclSend(static_cast<const char*>(in.data) + size_t(j) * bytes, n, type, j, comm_, stream_), "send");
      nccl_check(ncclRecv(static_cast<char*>(out.data) + size_t(j) * bytes, n, type, j, comm_, stream_), "recv");
    }
    nccl_check(ncclGroupEnd(), "group end");
  }

  void barrier() override {
    use_device();
    // A one-word all-reduce orders the ranks' streams; the host then waits for its own stream.
    nccl_check(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_, stream_), "barrier");
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (barrier)");
  }

 private:
  // Collectives come from the rank's thread, bound to this device when ParallelModel made the rank;
  // checked on every call (cheap: a thread-local read) so a call from another thread still enqueues
  // with the right device current.
  void use_device() const {
    int current = -1;
    cuda_check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device_) cuda_check(cudaSetDevice(device_), "cudaSetDevice");
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  cudaStream_t stream_;
  void* gather_staging_ = nullptr;
  void* barrier_word_ = nullptr;
  size_t gather_bytes_;
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const Backend::DeviceQueue> queues,
                                                                   size_t max_gather_bytes) {
  OSSRT_CHECK(!queues.empty(), "NCCL: a communicator group needs at least one rank");
  std::vector<int> devices;
  for (const Backend::DeviceQueue& q : queues) {
    OSSRT_CHECK(q.device >= 0 && q.native_stream, "NCCL communicators need device backends (device {})", q.device);
    devices.push_back(q.device);
  }
  // Before the first communicator exists: NCCL reads its environment at initialization.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const int n = int(devices.size());
  OSSRT_CHECK(n <= cuda_device_count(), "NCCL: {} ranks need {} GPUs, {} visible", n, n, cuda_device_count());
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  nccl_check(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(std::make_unique<NcclCommunicator>(comms[size_t(i)], i, n, devices[size_t(i)],
                                                     static_cast<cudaStream_t>(queues[size_t(i)].native_stream),
                                                     max_gather_bytes));
  return out;
}

}  // namespace ossrt
