#include "kernels/patch_rows.h"

#include "kernels/cpu/cpu_ops.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace iris::kernels {

void PatchRows(Device& device, const uint8_t* rgb, const PatchGrid& grid, const float* table, int64_t row_begin,
               int64_t row_end, float* out) {
  if (row_end <= row_begin) return;
  switch (device.kind()) {
    case DeviceKind::kCpu:
      return cpu::PatchRows(cpu::AsCpu(device), rgb, grid, table, row_begin, row_end, out);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchPatchRows(gpu.stream(), rgb, grid, table, row_begin, row_end, out), "PatchRows");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "PatchRows");
}

}  // namespace iris::kernels
