// The dispatch point of the gated MLP: the CUDA device's bf16 hand-off where it takes the call,
// else the two Linears.
#include "kernels/gated_mlp.h"

#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_linear.h"
#endif

namespace iris::kernels {

void GatedMlp(Device& device, const Linear& gate_up, const Linear& down, const LinearInput& in, int64_t m,
              const GatedMlpBuffers& buffers, float* y, RmsNormHandoff* next) {
  if (next != nullptr) next->parts = 0;
#ifdef IRIS_HAVE_CUDA
  if (device.kind() == DeviceKind::kCuda &&
      cuda::GatedMlpBf16Handoff(cuda::AsCuda(device), gate_up, down, in, m, buffers.gate_up_out, y, next)) {
    return;
  }
#endif
  LinearForward(device, gate_up, in, m, buffers.gate_up_out);
  LinearForward(device, down, LinearInput::SiluMul(buffers.gate_up_out, buffers.act_staging), m, y,
                Epilogue::kAccumulate);
}

}  // namespace iris::kernels
