#include "backend/cuda/cublas_linear.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/cublas_common.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffers.h"

namespace ossrt::cuda {
struct CublasLinear::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

CublasLinear::CublasLinear(DeviceBuffers& buffers) {
  cublasLtHandle_t h = nullptr;
  OSSRT_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  workspace_bytes_ = kCublasWorkspaceBytes;
  workspace_ = buffers.allocate(workspace_bytes_, "cuBLASLt workspace", nullptr);
}

CublasLinear::~CublasLinear() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

CublasLinear::Plan& CublasLinear::plan_for(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  const auto [m, n, k, out_f32, has_bias, align_x, align_w, align_out, align_bias] = key;
  auto plan = std::make_unique<Plan>();
  OSSRT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Row-major y = x W^T is column-major y^T[N, M] = W^T... : A = W viewed [K, N] col-major and
  // transposed, B = x viewed [K, M] col-major, D = y viewed [N, M] col-major.
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  OSSRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  OSSRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    OSSRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const cudaDataType_t bias_type = CUDA_R_16BF;
    OSSRT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  const cudaDataType_t out_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
  OSSRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, uint64_t(k), uint64_t(n), k));
  OSSRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, uint64_t(k), uint64_t(m), k));
  OSSRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, out_type, uint64_t(n), uint64_t(m), n));

  cublasLtMatmulPreference_t pref = nullptr;
  OSSRT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    OSSRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_bytes_));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(align_w));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(align_x));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(align_out));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(align_out));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->op, plan->a,
                                                           plan->b, plan->d, plan->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    fail("cuBLASLt found no algorithm for y[{}, {}] = x[{}, {}] W^T (out {}, bias {}, alignments x {} w {} out {}): {}",
         m, n, m, k, out_f32 ? "f32" : "bf16", has_bias, align_x, align_w, align_out, cublasLtGetStatusName(st));
  }
  plan->algo = result.algo;
  auto& ref = *plan;
  plans_.emplace(key, std::move(plan));
  return ref;
}

void CublasLinear::matmul(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k,
                          bool out_f32, CUstream_st* stream) {
  if (m == 0) return;
  OSSRT_CHECK(!(bias && out_f32), "linear: a bias with f32 output is not supported by the cuBLASLt path");
  const Key key{m,
                n,
                k,
                out_f32,
                bias != nullptr,
                cublas_pointer_alignment(x),
                cublas_pointer_alignment(w),
                cublas_pointer_alignment(out),
                bias ? cublas_pointer_alignment(bias) : 256};
  Plan& plan = plan_for(key);
  if (bias) {
    OSSRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  OSSRT_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.op, &alpha, w, plan.a, x, plan.b,
                                    &beta, out, plan.d, out, plan.d, &plan.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace ossrt::cuda
