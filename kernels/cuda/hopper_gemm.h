// iris's own Hopper GEMM (kernels/cuda/hopper_gemm.cuh) as host code calls it: bf16 rows times a
// bf16 weight's rows, f32 accumulation, the epilogue fused. Pointers are device memory; a launch
// only enqueues and returns its cudaError_t value (0: success), so this header needs no CUDA
// header. sm_90a only (wgmma, the copy engine): compute capability exactly 9.0.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace iris::kernels::cuda {

enum class HopperEpilogue : int {
  kF32,         // y f32: A·Bᵀ + bias (+ y where accumulate)
  kBf16,        // y bf16: A·Bᵀ + bias, rounded
  kSwiGluBf16,  // y bf16: silu(gate + bias) * (up + bias), rounded, where B's rows are n of gate
                // then n of up (a gated MLP's gate_up weight as stored) and the bias [2n] likewise
};

struct HopperGemm {
  HopperEpilogue epilogue = HopperEpilogue::kF32;
  const uint16_t* a = nullptr;  // [m][lda] bf16
  int64_t lda = 0;
  const uint16_t* b = nullptr;  // [n][ldb] bf16 ([2n][ldb] for kSwiGluBf16)
  int64_t ldb = 0;
  int64_t m = 0, n = 0, k = 0;  // n: y's columns
  const float* bias = nullptr;  // [n] ([2n] for kSwiGluBf16) or null
  void* y = nullptr;            // [m][ldy], f32 or bf16 by the epilogue
  int64_t ldy = 0;
  bool accumulate = false;      // kF32 only
  int tile_n = 128;             // B rows a block multiplies: 128 or 256 (twice the work per A byte)
};

// Whether the kernel takes g: a and b 16-byte aligned with row strides of whole 16-byte vectors
// (lda, ldb multiples of 8, at least k), ldy >= n, sizes that fit the kernel's 32-bit indices,
// tile_n 128 or 256.
bool HopperGemmTakes(const HopperGemm& g);

// Enqueues g on stream (cudaErrorInvalidValue where !HopperGemmTakes; the driver's error where
// its tensor maps cannot be made).
int LaunchHopperGemm(CUstream_st* stream, const HopperGemm& g);

}  // namespace iris::kernels::cuda
