#pragma once
// One rank's part of the host weights, for the sharded upload in GptOssModel (docs/parallel.md).
// Slices that are contiguous in the checkpoint are views into the same memory (no copy); the others
// are copied, in the checkpoint's own dtype/format, into buffers appended to `keep` (which must live
// until the backend has finished uploading them).
#include <cstdint>
#include <memory>
#include <vector>

#include "model/host_weights.h"

namespace ossrt {

using KeepAlive = std::vector<std::shared_ptr<void>>;

struct IndexRange {
  int64_t begin = 0, count = 0;
  int64_t end() const { return begin + count; }
};

// Rows [begin, begin + count) of dimension 0 (a view).
HostTensor slice_rows(const HostTensor& t, IndexRange rows);
// Columns of a 2-D tensor [rows, cols] (a copy).
HostTensor slice_columns(const HostTensor& t, IndexRange cols, KeepAlive& keep);

// Experts [experts.begin, end), logical rows `out_rows` of W[e] ([out, in]) and columns `in_cols`.
// The bias keeps the same rows, or is all zeros when `zero_bias` (a row-parallel split adds it on one
// rank only). MXFP4 stays MXFP4 when the column range is whole 32-element blocks; otherwise it is
// dequantized (exactly) to F32 Dense.
HostExperts slice_experts(const HostExperts& x, IndexRange experts, IndexRange out_rows, IndexRange in_cols,
                          bool zero_bias, KeepAlive& keep);

}  // namespace ossrt
