// The varlen attention followed by its output projection with the residual add, as one op (the
// vision blocks' attn + proj):
//   y[r] += proj(attention(q, k, v)[r])   for the query rows r in [args.q_begin, args.q_end)
// One op so that a device may hand the attention's output to the projection in a form of its
// own. The CUDA device (bf16 attention on iris's flash kernel, more rows than the GEMVs take,
// CudaDevice::bf16_handoff) has the flash kernel write the projection's bf16 input rows itself:
// no f32 output written and read back, no conversion launch. Elsewhere it is VarlenAttention
// into args.out, then proj.Forward on those rows with Epilogue::kAccumulate.
#pragma once

#include "kernels/attention.h"
#include "kernels/device.h"
#include "kernels/linear.h"

namespace iris::kernels {

// args: as VarlenAttention takes them, with a host-known row range (0 <= q_begin <= q_end) and
// out rows of exactly proj.in_features() values (out_row_stride == num_heads * head_dim ==
// proj.in_features()); args.out is the f32 staging where the hand-off does not apply (nothing
// may read it afterwards). y: [q_end - q_begin, proj.out_features()], row q_begin's first.
// next: y's next RMSNorm, which the device may hand on (as GatedMlp's).
void AttendAndProject(Device& device, const AttentionArgs& args, const Linear& proj, float* y,
                      RmsNormHandoff* next = nullptr);

}  // namespace iris::kernels
