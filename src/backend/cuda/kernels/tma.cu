// make_tma_map_2d_bf16 (tma.cuh): the driver's cuTensorMapEncodeTiled, reached through the runtime's
// entry-point query so that the backend keeps linking only the static runtime (no -lcuda).
#include <cudaTypedefs.h>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/tma.cuh"

namespace ossrt::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    OSSRT_CU_CHECK(e == cudaSuccess && found == cudaDriverEntryPointSuccess && p != nullptr,
                   "cuTensorMapEncodeTiled: not found in the CUDA driver (", cudaGetErrorString(e), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 2-D map of 16-bit elements (rows of cols, row after row), boxes of box_rows x box_cols.
CUtensorMap encode_2d_16bit(CUtensorMapDataType type, CUtensorMapSwizzle swizzle, const void* base, int64_t rows,
                            int64_t cols, int box_rows, int box_cols) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};  // bytes from one row to the next
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  OSSRT_CU_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", int(r), ") for a ", rows, " x ", cols,
                 " matrix of 16-bit elements in boxes of ", box_rows, " x ", box_cols);
  return map;
}

}  // namespace

CUtensorMap make_tma_map_2d_bf16(const void* base, int64_t rows, int64_t cols, int box_rows, int box_cols) {
  OSSRT_CU_CHECK(base != nullptr && rows > 0 && cols > 0 && (reinterpret_cast<uintptr_t>(base) % 128) == 0 &&
                     (cols * 2) % 16 == 0 && box_cols * 2 == 128 && box_rows > 0 && box_rows <= 256,
                 "make_tma_map_2d_bf16: a ", rows, " x ", cols, " bf16 matrix in boxes of ", box_rows, " x ", box_cols,
                 " (128-byte aligned base, 16-byte aligned rows, 128-byte box rows, at most 256 of them)");
  return encode_2d_16bit(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_SWIZZLE_128B, base, rows, cols, box_rows,
                         box_cols);
}

CUtensorMap make_tma_map_2d_u16(const void* base, int64_t rows, int64_t cols, int box_rows, int box_cols) {
  OSSRT_CU_CHECK(base != nullptr && rows > 0 && cols > 0 && (reinterpret_cast<uintptr_t>(base) % 16) == 0 &&
                     (cols * 2) % 16 == 0 && box_cols > 0 && box_cols <= 256 && (box_cols * 2) % 16 == 0 &&
                     box_rows > 0 && box_rows <= 256,
                 "make_tma_map_2d_u16: a ", rows, " x ", cols, " matrix of 16-bit units in boxes of ", box_rows, " x ",
                 box_cols,
                 " (16-byte aligned base and rows, box rows of a multiple of 16 bytes, at most 256 units "
                 "and 256 rows)");
  return encode_2d_16bit(CU_TENSOR_MAP_DATA_TYPE_UINT16, CU_TENSOR_MAP_SWIZZLE_NONE, base, rows, cols, box_rows,
                         box_cols);
}

}  // namespace ossrt::cuda
