// IRIS_HD_FN marks a function of a plain header that host code and iris's CUDA kernels both call
// (one definition, so that both compute the same bits): __host__ __device__ under nvcc, inline
// elsewhere (the host compiler, which also builds the kernels' SIMT harness).
#pragma once

#if defined(__CUDACC__)
#define IRIS_HD_FN __host__ __device__ __forceinline__
#else
#define IRIS_HD_FN inline
#endif
