#pragma once
// The CPU backend's FP8 formats (WeightFormat::Fp8 and Mxfp4Fp8; issue 15, docs/quantization.md),
// exactly: weights quantized at upload by 128x128 blocks of each checkpoint tensor, activations by
// 1x128 groups of each row at run time (core/fp8.h has the rule). The weights are stored as the f32
// values the GEMM sees (e4m3 value x block scale, one f32 product each), so the dense and expert
// loops are the reference ones, given quantized inputs.
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "core/threads.h"

namespace ossrt::cpu {

// Which weights a format quantizes: Fp8 every linear weight but the router; Mxfp4Fp8 the attention
// projections and the unembedding, the experts kept as the checkpoint's MXFP4 values.
bool quantizes_dense_weights(WeightFormat format);
bool quantizes_expert_weights(WeightFormat format);

// Writes `parts` (matrices with equal columns) stacked along rows at `dst` as f32, each part quantized
// on its own block grid.
void upload_fp8_parts(ThreadPool& pool, std::span<const HostTensor* const> parts, float* dst);

// Quantizes expert matrices f32 [experts, out, in] in place, each expert's [out, in] on its own grid;
// its block scales go to `scales` [experts, ceil(out / 128), ceil(in / 128)].
void fp8_quantize_experts_inplace(ThreadPool& pool, float* w, int64_t experts, int64_t out, int64_t in, float* scales);

// out = x quantized per row, per 128 channels from channel 0; x and out are [rows, n].
void fp8_quantize_activations(ThreadPool& pool, const float* x, int64_t rows, int64_t n, float* out);

}  // namespace ossrt::cpu
