// The vision blocks' q, k, v held as bf16 rows from the qkv projection to the attention: the qkv
// matmul writes bf16 rows (the bias added in f32, the sum rounded once), the fused rotary turns q
// and k in place in them (widened, rotated in f32, rounded: as HF rotates its bf16 q and k), and
// the attention reads them (HeadsView::bf16, AttentionInput::bf16). Half the bytes of the f32 rows
// at each of the three passes, and no rounding the attention would not do itself for v (q and k
// are rounded twice: before and after the rotary).
//
// A device's choice, made once per forward (every piece of a resumable forward must write the
// form the attention will read): the CUDA device makes it where the bf16 attention runs on iris's
// flash kernel, with bf16 compute and both CudaDevice::bf16_handoff and fold_linear_inputs on. The
// CPU never does (its kernels read f32 rows; they refuse bf16 views as a programming error).
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/linear.h"

namespace iris::kernels {

// Whether `device` holds q, k, v in bf16 between `qkv` and an attention whose AttentionArgs::bf16
// is `bf16_attention`, on the unpadded path (q, k, v read in place from the qkv rows).
bool KeepsQkvInBf16(Device& device, const Linear& qkv, bool bf16_attention);

// y = op(x)·Wᵀ + b as bf16 rows: m rows of stride ldy >= linear.out_features() values (the
// columns past it are left as they are), each value the f32 result rounded as core::FloatToBf16
// rounds. For every row count, on a device where KeepsQkvInBf16 holds for `linear`.
void LinearForwardToBf16(Device& device, const Linear& linear, const LinearInput& in, int64_t m, uint16_t* y,
                         int64_t ldy);

// The fused rotary of a qkv projection's bf16 rows: q's `heads` heads at column 0 and k's at
// heads * head_dim, turned by cos/sin [m][head_dim / 2] (kernels/rotary.h).
struct QkvRotary {
  int heads = 0;
  int head_dim = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// LinearForwardToBf16, then RotaryQK of q and k in place in y: the same values up to where the
// rounding happens. The CUDA device turns the heads in the matmul's epilogue where its Hopper GEMM
// runs every matmul (CudaDevice::HopperGemmUse::kAll) and takes the heads (80 values: the Qwen
// vision towers'), one launch for the projection and the rotary, y rounded once; else the two ops.
void LinearForwardToBf16Rotary(Device& device, const Linear& linear, const LinearInput& in, int64_t m, uint16_t* y,
                               int64_t ldy, const QkvRotary& rotary);

}  // namespace iris::kernels
