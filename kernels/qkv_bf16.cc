// The dispatch point of the qkv chain in bf16: the CUDA device's, and nothing elsewhere.
#include "kernels/qkv_bf16.h"

#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_linear.h"
#endif

namespace iris::kernels {

bool KeepsQkvInBf16(Device& device, const Linear& qkv, bool bf16_attention) {
#ifdef IRIS_HAVE_CUDA
  if (device.kind() == DeviceKind::kCuda) return cuda::KeepsQkvInBf16(cuda::AsCuda(device), qkv, bf16_attention);
#endif
  (void)device, (void)qkv, (void)bf16_attention;
  return false;
}

void LinearForwardToBf16(Device& device, const Linear& linear, const LinearInput& in, int64_t m, uint16_t* y,
                         int64_t ldy) {
#ifdef IRIS_HAVE_CUDA
  if (device.kind() == DeviceKind::kCuda) {
    return cuda::LinearForwardToBf16(cuda::AsCuda(device), linear, in, m, y, ldy);
  }
#endif
  (void)linear, (void)in, (void)m, (void)y, (void)ldy;
  NoKernelFor(device, "LinearForwardToBf16");
}

}  // namespace iris::kernels
