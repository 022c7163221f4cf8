// The one source of iris's own CUDA kernels, compiled two ways:
//   - by nvcc (__CUDACC__): the real thing; the macros below are CUDA's keywords;
//   - by the host compiler: a small SIMT harness, so that the kernels' device code runs in CI on
//     machines without a GPU, against the CPU kernels. A launch runs its blocks one at a time,
//     each CUDA thread of a block on its own std::thread (created once per launch), with
//     __syncthreads a barrier of the block's threads, __shared__ storage one static object
//     (blocks never overlap, so one copy serves each block in turn), and warp shuffles through a
//     per-warp exchange with a barrier of the warp's lanes.
// Kernels use only what this header names: IRIS_GLOBAL, IRIS_DEVICE, IRIS_HOST_DEVICE, IRIS_SHARED, SyncThreads(),
// SyncWarp(), ShflXor(), threadIdx/blockIdx/blockDim/gridDim (x, y, z), kWarpSize, and Launch for the host side.
// Every thread of a block must reach each SyncThreads (as CUDA requires), and a block's size is a
// multiple of the warp size when it shuffles.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)

#define IRIS_GLOBAL __global__
#define IRIS_DEVICE __device__ __forceinline__
#define IRIS_HOST_DEVICE __host__ __device__ __forceinline__
#define IRIS_SHARED __shared__

namespace iris::kernels::cuda {

constexpr int kWarpSize = 32;
__device__ __forceinline__ void SyncThreads() { __syncthreads(); }
__device__ __forceinline__ void SyncWarp() { __syncwarp(); }
template <typename T>
__device__ __forceinline__ T ShflXor(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

}  // namespace iris::kernels::cuda

#else  // the host harness

#include <algorithm>
#include <barrier>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

// Internal linkage: nvcc emits a host-side launch stub with each __global__ kernel's own name, so
// a test that links the CUDA objects (through an op's dispatch point) would otherwise get the
// stub in place of the harness's copy of the kernel.
#define IRIS_GLOBAL static inline
#define IRIS_DEVICE inline
#define IRIS_HOST_DEVICE inline
#define IRIS_SHARED static

namespace iris::kernels::cuda {

constexpr int kWarpSize = 32;

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  Dim3() = default;
  Dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT: as CUDA's dim3
  unsigned count() const { return x * y * z; }
};

namespace simt {

// A warp's lanes exchange values through here.
struct Warp {
  explicit Warp(int lanes) : sync(lanes) {}
  std::barrier<> sync;
  alignas(8) unsigned char slot[kWarpSize][8];
};

struct Block {
  explicit Block(int threads) : sync(threads) {}
  std::barrier<> sync;
  std::vector<std::unique_ptr<Warp>> warps;
};

struct ThreadState {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
  Block* block = nullptr;
  Warp* warp = nullptr;
  int lane = 0;
};

inline thread_local ThreadState tls;

}  // namespace simt

// CUDA's built-in index variables, per emulated thread.
#define threadIdx (::iris::kernels::cuda::simt::tls.thread_idx)
#define blockIdx (::iris::kernels::cuda::simt::tls.block_idx)
#define blockDim (::iris::kernels::cuda::simt::tls.block_dim)
#define gridDim (::iris::kernels::cuda::simt::tls.grid_dim)

inline void SyncThreads() { simt::tls.block->sync.arrive_and_wait(); }
// __syncwarp: the warp's lanes wait for each other (shared memory written by one lane is then
// visible to the others).
inline void SyncWarp() { simt::tls.warp->sync.arrive_and_wait(); }

template <typename T>
T ShflXor(T v, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  simt::Warp& w = *simt::tls.warp;
  const int lane = simt::tls.lane;
  std::memcpy(w.slot[lane], &v, sizeof(T));
  w.sync.arrive_and_wait();  // every lane has written
  T out;
  std::memcpy(&out, w.slot[lane ^ lane_mask], sizeof(T));
  w.sync.arrive_and_wait();  // every lane has read before the slots are reused
  return out;
}

// kernel<<<grid, block>>>(args...), on the host: returns when every block has run.
template <typename... Params, typename... Args>
void Launch(Dim3 grid, Dim3 block, void (*kernel)(Params...), Args&&... args) {
  const int threads = static_cast<int>(block.count());
  simt::Block b(threads);
  const int warps = (threads + kWarpSize - 1) / kWarpSize;
  for (int w = 0; w < warps; ++w) {
    b.warps.push_back(std::make_unique<simt::Warp>(std::min(kWarpSize, threads - w * kWarpSize)));
  }
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      simt::ThreadState& s = simt::tls;
      s.block_dim = block;
      s.grid_dim = grid;
      s.thread_idx = Dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
      s.block = &b;
      s.warp = b.warps[t / kWarpSize].get();
      s.lane = t % kWarpSize;
      for (unsigned bz = 0; bz < grid.z; ++bz) {
        for (unsigned by = 0; by < grid.y; ++by) {
          for (unsigned bx = 0; bx < grid.x; ++bx) {
            s.block_idx = Dim3(bx, by, bz);
            kernel(args...);
            b.sync.arrive_and_wait();  // the block is done before the next one reuses its shared storage
          }
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
}

}  // namespace iris::kernels::cuda

#endif
