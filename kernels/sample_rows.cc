// The dispatch point of SampleRows.
#include "kernels/sample_rows.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/device.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace iris::kernels {

void SampleRows(Device& device, float* logits, int64_t rows, int64_t vocab, const RowDraw* draws, int32_t* out) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::SampleRows(cpu::AsCpu(device), logits, rows, vocab, draws, out);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchSampleRows(gpu.stream(), logits, rows, vocab, draws, out), "SampleRows");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "SampleRows");
}

}  // namespace iris::kernels
