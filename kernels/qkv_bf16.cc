// The dispatch point of the qkv chain in bf16: the CUDA device's, and nothing elsewhere.
#include "kernels/qkv_bf16.h"

#include "kernels/rotary.h"

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

void LinearForwardToBf16Rotary(Device& device, const Linear& linear, const LinearInput& in, int64_t m, uint16_t* y,
                               int64_t ldy, const QkvRotary& rotary) {
#ifdef IRIS_HAVE_CUDA
  if (device.kind() == DeviceKind::kCuda &&
      cuda::LinearForwardToBf16Rotary(cuda::AsCuda(device), linear, in, m, y, ldy, rotary)) {
    return;
  }
#endif
  LinearForwardToBf16(device, linear, in, m, y, ldy);
  const int64_t k_col = int64_t{rotary.heads} * rotary.head_dim;
  RotaryQK(device, {nullptr, ldy, rotary.heads, y}, {nullptr, ldy, rotary.heads, y + k_col}, m, rotary.head_dim,
           rotary.cos, rotary.sin);
}

}  // namespace iris::kernels
