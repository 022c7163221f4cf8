// The dispatch point of the attention + projection: the CUDA device's bf16 hand-off where it
// takes the call, else the two ops.
#include "kernels/attention_projection.h"

#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_linear.h"
#endif

namespace iris::kernels {

void AttendAndProject(Device& device, const AttentionArgs& args, const Linear& proj, float* y,
                      RmsNormHandoff* next) {
  if (next != nullptr) next->parts = 0;
#ifdef IRIS_HAVE_CUDA
  if (device.kind() == DeviceKind::kCuda && cuda::AttendAndProjectBf16Handoff(cuda::AsCuda(device), args, proj, y, next)) {
    return;
  }
#endif
  VarlenAttention(device, args);
  proj.Forward(args.out + args.q_begin * args.out_row_stride, args.q_end - args.q_begin, y, Epilogue::kAccumulate);
}

}  // namespace iris::kernels
