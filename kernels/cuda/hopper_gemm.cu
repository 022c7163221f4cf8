// nvcc's side of hopper_gemm.cuh: the tensor maps (through the driver's cuTensorMapEncodeTiled,
// found at run time: the binaries link no libcuda) and the launch.
#include "kernels/cuda/hopper_gemm.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/cuda/hopper_gemm.cuh"
#include "kernels/cuda/hopper_probes.cuh"
#include "kernels/cuda/hopper_probes.h"
#include "kernels/cuda/launch_grid.cuh"

namespace iris::kernels::cuda {
namespace {

using EncodeTiled = decltype(&cuTensorMapEncodeTiled);

EncodeTiled Encoder() {
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return EncodeTiled{nullptr};
    }
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  return encode;
}

// A bf16 matrix of `rows` rows of `cols` values, `ld` apart, read in boxes of 64 values x box_rows
// rows with the 128-byte swizzle (the layout the kernel's wgmma descriptors describe), zeros past
// its edges.
int MakeMap(CUtensorMap* map, const uint16_t* base, int64_t cols, int64_t rows, int64_t ld, uint32_t box_rows) {
  const EncodeTiled encode = Encoder();
  if (encode == nullptr) return static_cast<int>(cudaErrorNotSupported);
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kHopperTileK), box_rows};
  const cuuint32_t elements[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(base), dims, strides, box,
                            elements, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : static_cast<int>(cudaErrorInvalidValue);
}

// Lets kKernel have `bytes` of dynamic shared memory, more than the 48 KB a kernel gets unasked;
// asked once per kernel and process (iris drives one GPU).
template <auto kKernel>
cudaError_t OptIntoSharedMemory(int bytes) {
  static const cudaError_t opted = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return opted;
}

template <HopperEpilogue kEpi, int kTileN>
int LaunchAs(CUstream_st* stream, const HopperGemm& g, const CUtensorMap& a, const CUtensorMap& b) {
  constexpr int kShared = HopperTile<kTileN>::kSharedBytes;
  if (const cudaError_t e = OptIntoSharedMemory<HopperGemmKernel<kEpi, kTileN>>(kShared); e != cudaSuccess) {
    return static_cast<int>(e);
  }
  const HopperGrid grid = HopperGemmGrid(g);
  HopperGemmKernel<kEpi, kTileN><<<grid.blocks, kHopperThreads, kShared, stream>>>(
      a, b, HopperGemmParamsOf(g));
  return LastLaunchError();
}

}  // namespace

int LaunchHopperGemm(CUstream_st* stream, const HopperGemm& g) {
  if (!HopperGemmTakes(g)) return static_cast<int>(cudaErrorInvalidValue);
  CUtensorMap a{}, b{};
  if (const int e = MakeMap(&a, g.a, g.k, g.m, g.lda, kHopperTileRows); e != 0) return e;
  if (const int e = MakeMap(&b, g.b, g.k, HopperGemmBRows(g), g.ldb, static_cast<uint32_t>(g.tile_n / 2)); e != 0) {
    return e;
  }
  int result = static_cast<int>(cudaErrorInvalidValue);
  WithHopperKernel(g, [&](auto kernel) {
    using K = decltype(kernel);
    result = LaunchAs<K::kEpilogue, K::kWidth>(stream, g, a, b);
  });
  return result;
}

int LaunchTmaBoxProbe(CUstream_st* stream, const uint16_t* m, int64_t rows, int64_t cols, int64_t ld, int32_t x,
                      int32_t y, unsigned char* out) {
  CUtensorMap map{};
  if (const int e = MakeMap(&map, m, cols, rows, ld, 64); e != 0) return e;
  if (const cudaError_t e = OptIntoSharedMemory<TmaBoxProbeKernel>(kProbeSharedBytes); e != cudaSuccess) {
    return static_cast<int>(e);
  }
  TmaBoxProbeKernel<<<1, 128, kProbeSharedBytes, stream>>>(map, x, y, out);
  return LastLaunchError();
}

int LaunchWgmmaProbe(CUstream_st* stream, const uint16_t* a, const uint16_t* b, int kk, float* d) {
  if (kk < 0 || kk > 3) return static_cast<int>(cudaErrorInvalidValue);
  if (const cudaError_t e = OptIntoSharedMemory<WgmmaProbeKernel>(kProbeSharedBytes); e != cudaSuccess) {
    return static_cast<int>(e);
  }
  WgmmaProbeKernel<<<1, 128, kProbeSharedBytes, stream>>>(a, b, kk, d);
  return LastLaunchError();
}

}  // namespace iris::kernels::cuda
