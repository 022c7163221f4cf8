// nvcc's side of linear_kernels.cuh: the launch configurations.
#include "kernels/cuda/linear_kernels.h"

#include <cuda_runtime.h>

#include "kernels/cuda/gemv_streamed.cuh"
#include "kernels/cuda/launch_grid.cuh"
#include "kernels/cuda/linear_kernels.cuh"

namespace iris::kernels::cuda {

int LaunchToBf16Rows(CUstream_st* stream, const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  if (ld < cols) return static_cast<int>(cudaErrorInvalidValue);
  if (rows * cols == 0) return 0;
  if (cols % 8 == 0 && ld % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    ToBf16Rows8Kernel<<<RowsGrid(rows, cols / 8), kLaunchThreads, 0, stream>>>(x, rows, cols, ld, out);
    return LastLaunchError();
  }
  ToBf16RowsKernel<<<RowsGrid(rows, cols), kLaunchThreads, 0, stream>>>(x, rows, cols, ld, out);
  return LastLaunchError();
}

int LaunchBiasGeluErf(CUstream_st* stream, float* y, int64_t rows, int64_t cols, const float* bias) {
  if (rows * cols == 0) return 0;
  BiasGeluErfKernel<<<RowsGrid(rows, cols), kLaunchThreads, 0, stream>>>(y, rows, cols, bias);
  return LastLaunchError();
}

namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The streamed GEMV's grid: as many of its blocks as are resident on the current GPU at once (an
// SM's worth, by the kernel's registers and shared memory, times the SMs), at most one per
// group. Any grid computes the same product; this one keeps every block streaming to the end.
// A template on the kernel itself, so that each instantiation (rows, op) keeps its own count:
// they share one function-pointer type.
template <auto kKernel>
unsigned StreamGrid(int threads, int64_t groups, int sm_count) {
  static const int per_sm = [threads] {
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, threads, 0) == cudaSuccess && n > 0 ? n : 1;
  }();
  const int64_t resident = static_cast<int64_t>(per_sm) * (sm_count > 0 ? sm_count : 1);
  return static_cast<unsigned>(groups < resident ? groups : resident);
}

template <GemvKernel kKernel, int kRows, bool kVecX, GemvX kOp>
void LaunchGemvAs(CUstream_st* stream, const uint16_t* w, int64_t ld, int64_t in, int64_t out, const GemvInput& x,
                  int rows, const float* bias, float beta, float* y, int sm_count, bool early) {
  if constexpr (kKernel == GemvKernel::kTensorCores) {
    const auto blocks = static_cast<unsigned>((out + kGemvMmaOutPerBlock - 1) / kGemvMmaOutPerBlock);
    LaunchMaybeEarly(stream, dim3(blocks), kGemvMmaThreads, early, GemvMmaKernel<kVecX, kOp>, w, ld, in, out, x,
                     rows, bias, beta, y, early);
  } else if constexpr (kKernel == GemvKernel::kCudaCoresStreamed && kVecX) {
    constexpr int kOuts = GemvStreamOuts(kRows);
    const unsigned blocks = StreamGrid<GemvStreamKernel<kRows, kOp>>(kGemvSimtThreads, (out + kOuts - 1) / kOuts,
                                                                      sm_count);
    LaunchMaybeEarly(stream, dim3(blocks), kGemvSimtThreads, early, GemvStreamKernel<kRows, kOp>, w, ld, in, out, x,
                     bias, beta, y, early);
  } else {
    constexpr bool kPipelined = kKernel == GemvKernel::kCudaCoresPipelined;
    const auto blocks = static_cast<unsigned>((out + kGemvSimtOutPerBlock - 1) / kGemvSimtOutPerBlock);
    LaunchMaybeEarly(stream, dim3(blocks), kGemvSimtThreads, early, GemvSimtKernel<kRows, kVecX, kOp, kPipelined>, w,
                     ld, in, out, x, bias, beta, y, early);
  }
}

// The instantiation for (vec_x, op): a plain x may be read value by value; the folded ops only
// as vectors.
template <GemvKernel kKernel, int kRows>
void LaunchGemvRows(CUstream_st* stream, bool vec_x, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                    const GemvInput& x, int rows, const float* bias, float beta, float* y, int sm_count, bool early) {
  switch (x.op) {
    case GemvX::kPlain:
      if (vec_x) {
        LaunchGemvAs<kKernel, kRows, true, GemvX::kPlain>(stream, w, ld, in, out, x, rows, bias, beta, y, sm_count,
                                                          early);
      } else {
        LaunchGemvAs<kKernel, kRows, false, GemvX::kPlain>(stream, w, ld, in, out, x, rows, bias, beta, y, sm_count,
                                                           early);
      }
      break;
    case GemvX::kRmsNorm:
      LaunchGemvAs<kKernel, kRows, true, GemvX::kRmsNorm>(stream, w, ld, in, out, x, rows, bias, beta, y, sm_count,
                                                          early);
      break;
    case GemvX::kSiluMul:
      LaunchGemvAs<kKernel, kRows, true, GemvX::kSiluMul>(stream, w, ld, in, out, x, rows, bias, beta, y, sm_count,
                                                          early);
      break;
  }
}

// A CUDA-cores GEMV, instantiated for the row count.
template <GemvKernel kKernel>
void LaunchGemvSimt(CUstream_st* stream, bool vec_x, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                    const GemvInput& x, int rows, const float* bias, float beta, float* y, int sm_count, bool early) {
  switch (rows) {
    case 1: return LaunchGemvRows<kKernel, 1>(stream, vec_x, w, ld, in, out, x, rows, bias, beta, y, sm_count, early);
    case 2: return LaunchGemvRows<kKernel, 2>(stream, vec_x, w, ld, in, out, x, rows, bias, beta, y, sm_count, early);
    case 3: return LaunchGemvRows<kKernel, 3>(stream, vec_x, w, ld, in, out, x, rows, bias, beta, y, sm_count, early);
    case 4: return LaunchGemvRows<kKernel, 4>(stream, vec_x, w, ld, in, out, x, rows, bias, beta, y, sm_count, early);
    case 5: return LaunchGemvRows<kKernel, 5>(stream, vec_x, w, ld, in, out, x, rows, bias, beta, y, sm_count, early);
    case 6: return LaunchGemvRows<kKernel, 6>(stream, vec_x, w, ld, in, out, x, rows, bias, beta, y, sm_count, early);
    case 7: return LaunchGemvRows<kKernel, 7>(stream, vec_x, w, ld, in, out, x, rows, bias, beta, y, sm_count, early);
    default: return LaunchGemvRows<kKernel, 8>(stream, vec_x, w, ld, in, out, x, rows, bias, beta, y, sm_count, early);
  }
  static_assert(kGemvMaxRows == 8, "one case per row count");
}

}  // namespace

bool GemvTakes(const GemvInput& x, int64_t in) {
  switch (x.op) {
    case GemvX::kPlain: return true;
    case GemvX::kRmsNorm:
      return in % 8 == 0 && Aligned16(x.x) && RmsNormVecThreads(x.x, x.norm_weight, x.x, in) > 0;
    case GemvX::kSiluMul: return in % 8 == 0 && Aligned16(x.x);
  }
  return false;
}

int LaunchGemvBf16(CUstream_st* stream, GemvKernel kernel, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                   GemvInput x, int64_t rows, const float* bias, float beta, float* y, int sm_count, bool early) {
  static_assert(kGemvMaxRowsPerLaunch == kGemvMaxRows, "linear_kernels.h names the kernels' limit");
  if (rows < 1 || rows > kGemvMaxRows || in < 1 || ld < in || ld % 8 != 0 || !Aligned16(w) || out < 1 ||
      !GemvTakes(x, in)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (x.op == GemvX::kRmsNorm) x.norm_threads = RmsNormVecThreads(x.x, x.norm_weight, x.x, in);
  const bool vec_x = in % 8 == 0 && Aligned16(x.x);
  const int r = static_cast<int>(rows);
  if (kernel == GemvKernel::kTensorCores) {
    LaunchGemvRows<GemvKernel::kTensorCores, 0>(stream, vec_x, w, ld, in, out, x, r, bias, beta, y, sm_count, early);
    return LastLaunchError();
  }
  if (kernel == GemvKernel::kCudaCoresStreamed) {
    LaunchGemvSimt<GemvKernel::kCudaCoresStreamed>(stream, vec_x, w, ld, in, out, x, r, bias, beta, y, sm_count, early);
  } else if (kernel == GemvKernel::kCudaCoresPipelined) {
    LaunchGemvSimt<GemvKernel::kCudaCoresPipelined>(stream, vec_x, w, ld, in, out, x, r, bias, beta, y, sm_count,
                                                    early);
  } else {
    LaunchGemvSimt<GemvKernel::kCudaCores>(stream, vec_x, w, ld, in, out, x, r, bias, beta, y, sm_count, early);
  }
  return LastLaunchError();
}

bool GemvRotaryKvTakes(GemvKernel kernel, const uint16_t* w, int64_t ld, int64_t in, int64_t out, const GemvInput& x,
                       int64_t rows, const GemvRotaryKv& rot) {
  const bool cuda_cores = kernel == GemvKernel::kCudaCores || kernel == GemvKernel::kCudaCoresPipelined;
  const bool layout = rot.head_dim > 0 && rot.head_dim % 8 == 0 && rot.q_heads > 0 && rot.k_heads > 0 &&
                      out == static_cast<int64_t>(rot.q_heads + 2 * rot.k_heads) * rot.head_dim;
  const bool tables = rot.cos != nullptr && rot.sin != nullptr && rot.slots != nullptr && rot.k_pool != nullptr &&
                      rot.v_pool != nullptr && rot.num_slots >= 0;
  return cuda_cores && layout && tables && rows >= 1 && rows <= kGemvRotaryKvMaxRows &&
         (x.op == GemvX::kPlain || x.op == GemvX::kRmsNorm) && in >= 1 && in % 8 == 0 && Aligned16(x.x) &&
         GemvTakes(x, in) && ld >= in && ld % 8 == 0 && Aligned16(w);
}

namespace {

template <int kRows, GemvX kOp, bool kPipelined>
void LaunchGemvRotaryKvAs(CUstream_st* stream, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                          const GemvInput& x, const float* bias, float* y, const GemvRotaryKv& rot, bool early) {
  LaunchMaybeEarly(stream, dim3(static_cast<unsigned>(GemvRotaryKvBlocks(rot))), kGemvSimtThreads, early,
                   GemvSimtRotaryKvKernel<kRows, kOp, kPipelined>, w, ld, in, out, x, bias, y, early, rot);
}

template <GemvX kOp, bool kPipelined>
void LaunchGemvRotaryKvRows(CUstream_st* stream, int rows, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                            const GemvInput& x, const float* bias, float* y, const GemvRotaryKv& rot, bool early) {
  static_assert(kGemvRotaryKvMaxRows == 4, "one case per row count");
  switch (rows) {
    case 1: return LaunchGemvRotaryKvAs<1, kOp, kPipelined>(stream, w, ld, in, out, x, bias, y, rot, early);
    case 2: return LaunchGemvRotaryKvAs<2, kOp, kPipelined>(stream, w, ld, in, out, x, bias, y, rot, early);
    case 3: return LaunchGemvRotaryKvAs<3, kOp, kPipelined>(stream, w, ld, in, out, x, bias, y, rot, early);
    default: return LaunchGemvRotaryKvAs<4, kOp, kPipelined>(stream, w, ld, in, out, x, bias, y, rot, early);
  }
}

}  // namespace

int LaunchGemvBf16RotaryKv(CUstream_st* stream, GemvKernel kernel, const uint16_t* w, int64_t ld, int64_t in,
                           int64_t out, GemvInput x, int64_t rows, const float* bias, float* y,
                           const GemvRotaryKv& rot, bool early) {
  if (!GemvRotaryKvTakes(kernel, w, ld, in, out, x, rows, rot)) return static_cast<int>(cudaErrorInvalidValue);
  if (x.op == GemvX::kRmsNorm) x.norm_threads = RmsNormVecThreads(x.x, x.norm_weight, x.x, in);
  const int r = static_cast<int>(rows);
  const bool pipelined = kernel == GemvKernel::kCudaCoresPipelined;
  if (x.op == GemvX::kRmsNorm) {
    if (pipelined) {
      LaunchGemvRotaryKvRows<GemvX::kRmsNorm, true>(stream, r, w, ld, in, out, x, bias, y, rot, early);
    } else {
      LaunchGemvRotaryKvRows<GemvX::kRmsNorm, false>(stream, r, w, ld, in, out, x, bias, y, rot, early);
    }
  } else if (pipelined) {
    LaunchGemvRotaryKvRows<GemvX::kPlain, true>(stream, r, w, ld, in, out, x, bias, y, rot, early);
  } else {
    LaunchGemvRotaryKvRows<GemvX::kPlain, false>(stream, r, w, ld, in, out, x, bias, y, rot, early);
  }
  return LastLaunchError();
}

bool PickGemv(int64_t rows, int64_t out_features, int64_t in_features, int max_rows, GemvKernel* kernel) {
  constexpr int64_t kSmallWeightBytes = int64_t{32} << 20;
  if (rows < 1 || rows > max_rows) return false;
  if (rows == 1) {
    *kernel = GemvKernel::kCudaCores;
    return true;
  }
  if (out_features * in_features * int64_t{2} > kSmallWeightBytes) return false;
  *kernel = rows <= 4 ? GemvKernel::kCudaCores : GemvKernel::kTensorCores;
  return true;
}

int LaunchPrefetchL2(CUstream_st* stream, const void* p, int64_t bytes, bool early) {
  bytes -= bytes % 16;
  if (!Aligned16(p) || bytes < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (bytes == 0) return 0;
  // A warp a block, one piece a lane: the requests spread over SMs (each has its own bulk copy unit).
  constexpr int kThreads = 32;
  const int64_t pieces = (bytes + kPrefetchPieceBytes - 1) / kPrefetchPieceBytes;
  const int64_t blocks = (pieces + kThreads - 1) / kThreads;
  LaunchMaybeEarly(stream, dim3(static_cast<unsigned>(blocks < 1024 ? blocks : 1024)), kThreads, early,
                   PrefetchL2Kernel, static_cast<const char*>(p), bytes);
  return LastLaunchError();
}

int LaunchReadSum(CUstream_st* stream, const float* x, int64_t n, int blocks, float* partials) {
  if (n % 4 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || blocks <= 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  ReadSumKernel<<<static_cast<unsigned>(blocks), kLaunchThreads, 0, stream>>>(reinterpret_cast<const Float4*>(x), n / 4,
                                                                       partials);
  return LastLaunchError();
}

}  // namespace iris::kernels::cuda
