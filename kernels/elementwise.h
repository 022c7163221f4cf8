// Row-wise and element-wise ops the models call. All float32, row-major, in device memory.
// `out` may alias the input where noted.
#pragma once

#include <cstdint>

#include "kernels/device.h"

namespace iris::kernels {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight   (HF Qwen2RMSNorm, f32 math).
// y may alias x.
void RmsNorm(Device& device, const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y);

// out[r, j] = silu(gu[r, j]) * gu[r, inter + j] for j < inter, where each row of gu holds
// [gate(inter) | up(inter)] (the fused gate/up projection's output).
void SiluMulRows(Device& device, const float* gu, int64_t rows, int64_t inter, float* out);

// out[r, j] = silu(gate[r, j]) * up[r, j] for two separate [rows, n] arrays. out may alias gate.
void SiluMul(Device& device, const float* gate, const float* up, int64_t n, float* out);

// y = gelu(x) with the exact erf form. y may alias x.
void GeluErf(Device& device, const float* x, int64_t n, float* y);

// y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight + bias   (torch LayerNorm, biased variance).
// y may alias x.
void LayerNorm(Device& device, const float* x, const float* weight, const float* bias, int64_t rows, int64_t dim,
               float eps, float* y);

// y = x * sigmoid(1.702 x)   (QuickGELU, Qwen2-VL's vision MLP). y may alias x.
void QuickGelu(Device& device, const float* x, int64_t n, float* y);

// y = a + b. y may alias a or b.
void Add(Device& device, const float* a, const float* b, int64_t n, float* y);

}  // namespace iris::kernels
