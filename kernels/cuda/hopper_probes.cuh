// Two probes of the Hopper primitives the GEMM (hopper_gemm.cuh) stands on, each alone, so that a
// first run on a GPU says which one differs from what the kernel assumes: the copy engine's box
// as it lands in shared memory (the tensor map and the 128-byte swizzle), and one warpgroup MMA on
// tiles the threads wrote in that layout themselves (the descriptor, its K step, the accumulator
// fragment). Shared with the SIMT harness, which checks the probes against its twins.
#pragma once

#include <cstdint>

#include "kernels/cuda/simt.h"

namespace iris::kernels::cuda {

// Where byte b of row r of a 128-byte-swizzled tile lives (the tile 1024-byte aligned): rows 128
// bytes apart, the 16-byte chunk XOR the row's place in its group of 8.
IRIS_HOST_DEVICE int Swizzled128Offset(int row, int byte) {
  return row * 128 + (((byte / 16) ^ (row % 8)) * 16) + byte % 16;
}

constexpr int kProbeBoxBytes = 64 * 128;  // a 64-row box of 64 bf16 values
constexpr int kProbeSharedBytes = 3 * kProbeBoxBytes + 1024 + 64;

IRIS_DEVICE unsigned char* ProbeShared() {
  unsigned char* raw = DynamicShared();
  return raw + ((1024 - reinterpret_cast<uintptr_t>(raw) % 1024) % 1024);
}

// One block of 128 threads: the copy engine lands map's box (64 values x 64 rows) at (x, y); the
// block copies the 8192 bytes of shared memory, as they landed, to out.
IRIS_GLOBAL void TmaBoxProbeKernel(const IRIS_GRID_CONSTANT TmaMap2d map, int32_t x, int32_t y, unsigned char* out) {
#if IRIS_SM90A_CODE
  unsigned char* box = ProbeShared();
  uint64_t* bar = reinterpret_cast<uint64_t*>(box + kProbeBoxBytes);
  if (threadIdx.x == 0) {
    MBarrierInit(bar, 1);
    MBarrierInitFence();
  }
  SyncThreads();
  if (threadIdx.x == 0) {
    MBarrierArriveExpectTx(bar, kProbeBoxBytes);
    TmaLoad2d(box, &map, x, y, bar);
  }
  MBarrierWait(bar, 0);
  for (int i = static_cast<int>(threadIdx.x); i < kProbeBoxBytes; i += static_cast<int>(blockDim.x)) out[i] = box[i];
#endif
}

// One warpgroup (128 threads): A [64][64] and B [128][64] bf16 (row-major, K contiguous) written
// into shared memory by the threads in the 128-byte-swizzled layout, then one m64n128k16 MMA at
// K step kk (values 16kk..16kk+15) with accumulate off, and d [64][128] f32 written from each
// thread's accumulators by the documented fragment layout.
IRIS_GLOBAL void WgmmaProbeKernel(const uint16_t* a, const uint16_t* b, int kk, float* d) {
#if IRIS_SM90A_CODE
  unsigned char* tile_a = ProbeShared();
  unsigned char* tile_b = tile_a + kProbeBoxBytes;  // 128 rows: two boxes
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < 64 * 64; i += 128) {
    *reinterpret_cast<uint16_t*>(tile_a + Swizzled128Offset(i / 64, 2 * (i % 64))) = a[i];
  }
  for (int i = t; i < 128 * 64; i += 128) {
    *reinterpret_cast<uint16_t*>(tile_b + Swizzled128Offset(i / 64, 2 * (i % 64))) = b[i];
  }
  FenceProxyAsync();
  SyncThreads();
  float acc[64];
  IRIS_UNROLL
  for (int i = 0; i < 64; ++i) acc[i] = -1.f;  // accumulate off: these must not survive
  WgmmaFence();
  WgmmaHoldRegisters(acc);
  WgmmaM64K16Bf16<128>(acc, WgmmaDescAdvance(WgmmaDescSw128(tile_a), 32 * kk),
                      WgmmaDescAdvance(WgmmaDescSw128(tile_b), 32 * kk), 0);
  WgmmaCommit();
  WgmmaWait<0>();
  WgmmaHoldRegisters(acc);
  const int lane = t % 32, group = lane / 4, q = lane % 4;
  for (int j = 0; j < 16; ++j) {
    for (int i = 0; i < 4; ++i) {
      d[(16 * (t / 32) + group + 8 * (i / 2)) * 128 + 8 * j + 2 * q + i % 2] = acc[4 * j + i];
    }
  }
#endif
}

}  // namespace iris::kernels::cuda
