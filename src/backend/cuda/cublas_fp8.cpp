#include "backend/cuda/cublas_fp8.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffers.h"

namespace ossrt::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

int pointer_alignment(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && addr % uintptr_t(align) != 0) align /= 2;
  return align;
}

}  // namespace

struct CublasFp8::Plan {
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

CublasFp8::CublasFp8(DeviceBuffers& buffers) {
  if (const char* s = std::getenv("OSSRT_CUDA_FP8_SCALE_LAYOUT")) {
    OSSRT_CHECK(std::sscanf(s, "%d", &layout_) == 1 && layout_ >= 0 && layout_ <= 3,
                "OSSRT_CUDA_FP8_SCALE_LAYOUT must be 0..3, not '{}'", s);
  }
  cublasLtHandle_t h = nullptr;
  OSSRT_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  workspace_bytes_ = kWorkspaceBytes;
  workspace_ = buffers.allocate(workspace_bytes_, "cuBLASLt FP8 workspace", nullptr);
}

CublasFp8::~CublasFp8() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

CublasFp8::Plan* CublasFp8::plan_for(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  const auto [m, n, k, out_f32, has_bias, align_out] = key;
  auto plan = std::make_unique<Plan>();
  OSSRT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value) {
    OSSRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, attr, &value, sizeof(value)));
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, trans_a);
  set(CUBLASLT_MATMUL_DESC_TRANSB, trans_b);
  const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode);
  set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode);
  if (has_bias) {
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
  }
  const cudaDataType_t out_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
  OSSRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k));
  OSSRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k));
  OSSRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, out_type, uint64_t(n), uint64_t(m), n));
  cublasLtMatmulPreference_t pref = nullptr;
  OSSRT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    OSSRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_bytes_));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(256));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(256));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(align_out));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(align_out));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->op, plan->a,
                                                           plan->b, plan->d, plan->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    // Once per shape: the caller's own kernel serves it from now on.
    spdlog::info(
        "cuda: cuBLASLt has no block-scaled FP8 algorithm for y[{}, {}] (k {}, out {}, bias {}): {}; our "
        "FP8 kernel runs it",
        m, n, k, out_f32 ? "f32" : "bf16", has_bias, cublasLtGetStatusName(st));
    plans_.emplace(key, nullptr);
    return nullptr;
  }
  plan->algo = result.algo;
  Plan* ref = plan.get();
  plans_.emplace(key, std::move(plan));
  return ref;
}

bool CublasFp8::ready(int64_t m, int64_t n, int64_t k_pad, bool out_f32, bool has_bias, const void* out) {
  if (has_bias && out_f32) return false;
  if (m == 0 || m % 4 != 0 || k_pad % 512 != 0) return false;
  return plan_for(Key{m, n, k_pad, out_f32, has_bias, pointer_alignment(out)}) != nullptr;
}

bool CublasFp8::matmul(const uint8_t* x_codes, const float* x_scales, const uint8_t* w, const float* w_scales,
                       const void* bias, void* out, int64_t m, int64_t n, int64_t k_pad, bool out_f32,
                       CUstream_st* stream) {
  if (bias && out_f32) return false;
  OSSRT_CHECK(m % 4 == 0 && k_pad % 512 == 0, "cuBLASLt FP8: m {} (a multiple of 4) k_pad {} (of 512)", m, k_pad);
  if (m == 0) return true;
  Plan* plan = plan_for(Key{m, n, k_pad, out_f32, bias != nullptr, pointer_alignment(out)});
  if (!plan) return false;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* p) {
    OSSRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, attr, &p, sizeof(p)));
  };
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scales);
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scales);
  if (bias) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.0f, beta = 0.0f;
  OSSRT_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan->op, &alpha, w, plan->a, x_codes,
                                    plan->b, &beta, out, plan->d, out, plan->d, &plan->algo, workspace_,
                                    workspace_bytes_, stream));
  return true;
}

}  // namespace ossrt::cuda
