// The gated MLP of the Qwen2 text decoder and of Qwen2.5-VL's vision blocks, as one op:
//   y += down(silu(gate) * up),  [gate | up] = gate_up(op(x))   (each Linear with its own bias)
// One op, not two Linears, so that a device may hand gate_up's output to the SiLU·mul in a form
// of its own. The CUDA device (bf16 compute, more rows than its GEMVs take, both
// CudaDevice::bf16_handoff and fold_linear_inputs on) has cuBLASLt write gate_up's output as bf16
// rows, which the SiLU·mul reads as it writes down's bf16 input rows: half the bytes of the f32
// rows written and read back, the largest activation of a block. Elsewhere it is the two
// LinearForward calls: gate_up into `gate_up_out`, then down on LinearInput::SiluMul.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/linear.h"

namespace iris::kernels {

struct GatedMlpBuffers {
  // [m, gate_up.out_features()] f32 in the device's memory: gate_up's output. The device may
  // keep its own form there instead: nothing may read it afterwards.
  float* gate_up_out = nullptr;
  // [m, down.in_features()] f32: the SiLU·mul's output where down does not fold it (staging).
  float* act_staging = nullptr;
};

// y: [m, down.out_features()], accumulated into. gate_up.out_features() must be
// 2 * down.in_features() (gate rows, then up rows). next: where y is a residual stream read next
// through an RMSNorm, that norm, which the device may hand on (RmsNormHandoff; its parts say
// whether it did); null: none.
void GatedMlp(Device& device, const Linear& gate_up, const Linear& down, const LinearInput& in, int64_t m,
              const GatedMlpBuffers& buffers, float* y, RmsNormHandoff* next = nullptr);

}  // namespace iris::kernels
