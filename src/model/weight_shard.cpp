// Host weight slicing for tensor / expert parallel ranks. Everything is a "box" out of a 3-D byte
// array [d0][d1][d2 bytes]: experts x rows x row bytes, which covers all three expert formats and
// the 2-D matrices (d0 = 1).
#include "model/weight_shard.h"

#include <cstring>

#include "core/error.h"

namespace ossrt {

namespace {

struct Box {
  IndexRange r0, r1, r2;  // r2 in bytes
};

// Copies box `b` out of a [d0][d1][d2] byte array, or returns a pointer into it when the box is
// contiguous (whole rows of dimension 1 and 2).
const void* take_box(const void* src, int64_t d1, int64_t d2, const Box& b, KeepAlive& keep) {
  const auto* base = static_cast<const std::byte*>(src);
  if (b.r1.begin == 0 && b.r1.count == d1 && b.r2.begin == 0 && b.r2.count == d2) return base + b.r0.begin * d1 * d2;
  auto buffer = std::make_shared<std::vector<std::byte>>(size_t(b.r0.count * b.r1.count * b.r2.count));
  std::byte* dst = buffer->data();
  for (int64_t i = b.r0.begin; i < b.r0.end(); ++i)
    for (int64_t j = b.r1.begin; j < b.r1.end(); ++j) {
      std::memcpy(dst, base + (i * d1 + j) * d2 + b.r2.begin, size_t(b.r2.count));
      dst += b.r2.count;
    }
  keep.push_back(buffer);
  return buffer->data();
}

void check_range(IndexRange r, int64_t n, const std::string& what) {
  OSSRT_CHECK(r.begin >= 0 && r.count >= 0 && r.end() <= n, "weight shard: {} range [{}, {}) outside [0, {})", what,
              r.begin, r.end(), n);
}

IndexRange bytes(IndexRange r, int64_t elem_bytes) { return {r.begin * elem_bytes, r.count * elem_bytes}; }

HostTensor with(const HostTensor& t, const void* data, std::vector<int64_t> shape) {
  HostTensor out = t;
  out.data = data;
  out.shape = std::move(shape);
  return out;
}

HostTensor zeros_f32(std::vector<int64_t> shape, const std::string& name, KeepAlive& keep) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  auto buffer = std::make_shared<std::vector<float>>(size_t(n), 0.0f);
  keep.push_back(buffer);
  return HostTensor{buffer->data(), DType::F32, std::move(shape), name + " (zero on this rank)"};
}

// The fallback for a box MXFP4 cannot express: dequantize the wanted rows, keep the wanted columns.
HostTensor dense_f32_box(const HostExperts& x, IndexRange ex, IndexRange rows, IndexRange cols, KeepAlive& keep) {
  auto buffer = std::make_shared<std::vector<float>>(size_t(ex.count * rows.count * cols.count));
  std::vector<float> row(size_t(x.in));
  float* dst = buffer->data();
  for (int64_t e = ex.begin; e < ex.end(); ++e)
    for (int64_t r = rows.begin; r < rows.end(); ++r) {
      x.row_f32(e, r, row.data());
      std::memcpy(dst, row.data() + cols.begin, size_t(cols.count) * sizeof(float));
      dst += cols.count;
    }
  keep.push_back(buffer);
  return HostTensor{
      buffer->data(), DType::F32, {ex.count, rows.count, cols.count}, x.blocks.name + " (dequantized slice)"};
}

}  // namespace

HostTensor slice_rows(const HostTensor& t, IndexRange rows) {
  OSSRT_CHECK(!t.empty() && !t.shape.empty(), "weight shard: '{}' is empty or a scalar", t.name);
  check_range(rows, t.shape[0], "row of '" + t.name + "'");
  std::vector<int64_t> shape = t.shape;
  const int64_t row_bytes = t.numel() / shape[0] * int64_t(dtype_size(t.dtype));
  shape[0] = rows.count;
  return with(t, static_cast<const std::byte*>(t.data) + rows.begin * row_bytes, std::move(shape));
}

HostTensor slice_columns(const HostTensor& t, IndexRange cols, KeepAlive& keep) {
  OSSRT_CHECK(!t.empty() && t.shape.size() == 2, "weight shard: '{}' is not a matrix", t.name);
  check_range(cols, t.shape[1], "column of '" + t.name + "'");
  const int64_t s = int64_t(dtype_size(t.dtype));
  const void* data = take_box(t.data, t.shape[0], t.shape[1] * s, Box{{0, 1}, {0, t.shape[0]}, bytes(cols, s)}, keep);
  return with(t, data, {t.shape[0], cols.count});
}

HostExperts slice_experts(const HostExperts& x, IndexRange ex, IndexRange rows, IndexRange cols, bool zero_bias,
                          KeepAlive& keep) {
  check_range(ex, x.experts, "expert");
  check_range(rows, x.out, "expert row");
  check_range(cols, x.in, "expert column");
  HostExperts out = x;
  out.experts = ex.count, out.out = rows.count, out.in = cols.count;
  switch (x.format) {
    case HostExperts::Format::Dense: {
      const int64_t s = int64_t(dtype_size(x.weight.dtype));
      out.weight = with(x.weight, take_box(x.weight.data, x.out, x.in * s, Box{ex, rows, bytes(cols, s)}, keep),
                        {ex.count, rows.count, cols.count});
      break;
    }
    case HostExperts::Format::DenseTransposed: {  // [E, in, out]
      const int64_t s = int64_t(dtype_size(x.weight.dtype));
      out.weight = with(x.weight, take_box(x.weight.data, x.in, x.out * s, Box{ex, cols, bytes(rows, s)}, keep),
                        {ex.count, cols.count, rows.count});
      break;
    }
    case HostExperts::Format::Mxfp4: {
      const int64_t per_block = kMxfp4BlockElems, block_bytes = kMxfp4BlockBytes, blocks_per_row = x.in / per_block;
      if (cols.begin % per_block == 0 && cols.count % per_block == 0) {
        const IndexRange block_cols{cols.begin / per_block, cols.count / per_block};
        out.blocks = with(x.blocks,
                          take_box(x.blocks.data, x.out, blocks_per_row * block_bytes,
                                   Box{ex, rows, bytes(block_cols, block_bytes)}, keep),
                          {ex.count, rows.count, block_cols.count, block_bytes});
        out.scales = with(x.scales, take_box(x.scales.data, x.out, blocks_per_row, Box{ex, rows, block_cols}, keep),
                          {ex.count, rows.count, block_cols.count});
      } else {
        out.format = HostExperts::Format::Dense;
        out.weight = dense_f32_box(x, ex, rows, cols, keep);
        out.blocks = out.scales = HostTensor{};
      }
      break;
    }
  }
  if (zero_bias) {
    out.bias = zeros_f32({ex.count, rows.count}, x.bias.name, keep);
  } else {
    const int64_t s = int64_t(dtype_size(x.bias.dtype));
    OSSRT_CHECK(x.bias.numel() == x.experts * x.out, "weight shard: bias '{}' has {} elements, expected {}",
                x.bias.name, x.bias.numel(), x.experts * x.out);
    out.bias = with(x.bias, take_box(x.bias.data, 1, x.out * s, Box{ex, {0, 1}, bytes(rows, s)}, keep),
                    {ex.count, rows.count});
  }
  return out;
}

}  // namespace ossrt
