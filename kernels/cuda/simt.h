// The one source of iris's own CUDA kernels, compiled two ways:
//   - by nvcc (__CUDACC__): the real thing; the macros below are CUDA's keywords;
//   - by the host compiler: a small SIMT harness, so that the kernels' device code runs in CI on
//     machines without a GPU, against the CPU kernels. A launch runs its blocks one at a time,
//     each CUDA thread of a block on its own std::thread (created once per launch), with
//     __syncthreads a barrier of the block's threads, __shared__ storage one static object
//     (blocks never overlap, so one copy serves each block in turn), and warp shuffles through a
//     per-warp exchange with a barrier of the warp's lanes.
// Kernels use only what this header names: IRIS_GLOBAL, IRIS_DEVICE, IRIS_HOST_DEVICE, IRIS_SHARED, IRIS_UNROLL,
// IRIS_LAUNCH_BOUNDS, SyncThreads(),
// SyncWarp(), ShflXor(), ThreadFence(), AtomicAddInt(), LoadCoherent(), GridDependencyWait(),
// GridDependencyTrigger(), PrefetchL2(), PrefetchL2Bulk(), Exp2Approx(), MmaBf16() (a warp's
// tensor-core product, with a scalar twin here), CpAsync16()/CpAsyncCommit()/CpAsyncWait<N>()
// (copies to shared memory in flight while the thread computes; here they land at the wait),
// LdMatrixX4()/LdMatrixX4Trans() (a warp's fragment loads from shared memory), Hopper's
// DynamicShared(), MBarrier*() (transaction barriers), TmaLoad2d() (the bulk tensor copy, its
// TmaMap2d) and Wgmma*() (warpgroup MMAs, N 128, 240 or 256, from shared-memory descriptors, twinned on the host by
// decoding the descriptor as the hardware does), IRIS_SM90A_CODE and IRIS_GRID_CONSTANT,
// threadIdx/blockIdx/blockDim/gridDim (x, y, z), kWarpSize, and Launch/LaunchShared for the host side.
// Every thread of a block must reach each SyncThreads (as CUDA requires), and a block's size is a
// multiple of the warp size when it shuffles.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)

#include <cuda.h>  // CUtensorMap

#define IRIS_GLOBAL __global__
#define IRIS_DEVICE __device__ __forceinline__
#define IRIS_HOST_DEVICE __host__ __device__ __forceinline__
#define IRIS_SHARED __shared__
#define IRIS_UNROLL _Pragma("unroll")
// A kernel's promise of at most `threads` per block, asking for registers that let `blocks` of
// them share an SM.
#define IRIS_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)

namespace iris::kernels::cuda {

constexpr int kWarpSize = 32;

__device__ __forceinline__ void SyncThreads() { __syncthreads(); }
__device__ __forceinline__ void SyncWarp() { __syncwarp(); }
template <typename T>
__device__ __forceinline__ T ShflXor(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

// d += A·B for one warp on the tensor cores: A a 16x16 bf16 tile, B 16x8 bf16, D 16x8 f32, in
// PTX's mma.m16n8k16 fragment layout. With lane = 4 * group + t:
//   a[0] = A[group][2t, 2t+1]    a[1] = A[group+8][2t, 2t+1]
//   a[2] = A[group][2t+8, 2t+9]  a[3] = A[group+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][group]    b[1] = B[2t+8, 2t+9][group]
//   d[0], d[1] = D[group][2t, 2t+1]    d[2], d[3] = D[group+8][2t, 2t+1]
// each 32-bit register holding its lower-index element in the low half (PackBf16x2). Every lane
// of a full warp takes part. sm_80 and later.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__)
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Four floats read as one 16-byte load (the address is 16-byte aligned); two as one 8-byte one.
using Float4 = float4;
using Float2 = float2;

// Asynchronous copies global -> shared (sm_80 and later), 16 bytes each: CpAsync16 issues one
// (valid false: no bytes are read and the 16 bytes are zeros; src must still be an address of the
// buffer), CpAsyncCommit closes this thread's copies issued since the last commit into a group,
// CpAsyncWait<N> waits until at most the N newest groups are still in flight. A thread sees only
// its own copies land: a barrier after the wait makes the block's copies visible to every thread.
// dst and src are 16-byte aligned.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;");
#endif
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

// A warp loads four 8x8 tiles of 16-bit values from shared memory (ldmatrix, sm_75 and later):
// lane 8i + j gives the address of tile i's row j (16 bytes, 16-byte aligned). With
// lane = 4 * group + t, r[i] is tile i's row `group`, values 2t and 2t + 1 (the lower index in the
// low half); with Trans, r[i] is tile i's column `group`, rows 2t and 2t + 1 (the tile transposed):
// the mma's B fragment of a matrix stored k-major, as V's rows [key][dim] are.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__)
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__)
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

// Device-wide ordering for a block that hands results to another block of the same launch:
// ThreadFence makes this thread's earlier writes visible to the whole GPU, AtomicAddInt counts
// arrivals (returns the old value), LoadCoherent reads another block's write through the L2
// (never a stale L1 line).
__device__ __forceinline__ void ThreadFence() { __threadfence(); }
__device__ __forceinline__ int AtomicAddInt(int* p, int v) { return atomicAdd(p, v); }
__device__ __forceinline__ float LoadCoherent(const float* p) { return __ldcg(p); }
__device__ __forceinline__ int32_t LoadCoherent(const int32_t* p) { return __ldcg(p); }

// Programmatic dependent launch (sm_90; no-ops before): a kernel launched with the programmatic
// stream-serialization attribute may start before the kernel ahead of it on the stream ends.
// GridDependencyWait blocks until that kernel has completed and its writes are visible: such a
// kernel reads nothing another kernel writes, and writes nothing, before it. GridDependencyTrigger
// lets the kernel behind this one start early (it still waits in its GridDependencyWait).
// PrefetchL2 asks for the 128-byte line holding p in the L2 (a hint: it reads nothing into
// registers and cannot fault).
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void GridDependencyTrigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void PrefetchL2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}
// PrefetchL2Bulk asks for [p, p + bytes) in the L2 with one instruction (sm_90's bulk copy unit;
// p 16-byte aligned, bytes a multiple of 16); below sm_90 it asks for nothing.
__device__ __forceinline__ void PrefetchL2Bulk(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}
// 2^x by the SFU's one instruction (about 2 ulp; results below 2^-126 are zeros, -inf gives 0):
// the attention softmax's probabilities, where exp2f's and expf's guards cost instructions and
// registers.
__device__ __forceinline__ float Exp2Approx(float x) {
  float y = 0.f;
#if defined(__CUDA_ARCH__)
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
#endif
  return y;
}


// --- Hopper (sm_90a only: the "a" features): the bulk tensor copy engine (TMA), transaction
// barriers in shared memory (mbarrier) and the warpgroup MMAs (wgmma). A kernel that uses them
// compiles its body only where IRIS_SM90A_CODE is 1 (the sm_90a device pass, and the harness).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define IRIS_SM90A_CODE 1
#else
#define IRIS_SM90A_CODE 0
#endif
// A kernel parameter read in place from the constant bank (a tensor map must be: the copy
// engine reads it by address).
#define IRIS_GRID_CONSTANT __grid_constant__

// A 2-D tensor map (cuTensorMapEncodeTiled's): a bf16 matrix in global memory, its box, and the
// 128-byte swizzle (kernels/cuda/hopper_gemm.cu makes them).
using TmaMap2d = CUtensorMap;
// A wgmma shared-memory matrix descriptor (the PTX ISA's "matrix descriptor": start address,
// leading and stride byte offsets, swizzle mode).
using WgmmaDesc = uint64_t;

// The block's dynamic shared memory (the launch's third argument), at least 16-byte aligned.
__device__ __forceinline__ unsigned char* DynamicShared() {
  extern __shared__ __align__(16) unsigned char iris_dynamic_shared[];
  return iris_dynamic_shared;
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A transaction barrier: `count` arrivals and, where set, the bytes the copy engine must land
// complete each phase. MBarrierWait(bar, parity) returns once the phase of that parity has
// completed (a fresh barrier counts its phase "-1", parity 1, as completed); MBarrierWaitPhase
// (below) names the phase.
__device__ __forceinline__ void MBarrierInit(uint64_t* bar, int count) {
#if IRIS_SM90A_CODE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddress(bar)), "r"(count) : "memory");
#endif
}
// After a block's MBarrierInit calls (then a SyncThreads): the copy engine sees them initialised.
__device__ __forceinline__ void MBarrierInitFence() {
#if IRIS_SM90A_CODE
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// One arrival that also announces `bytes` the copy engine will land in this phase.
__device__ __forceinline__ void MBarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) {
#if IRIS_SM90A_CODE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void MBarrierArrive(uint64_t* bar) {
#if IRIS_SM90A_CODE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SharedAddress(bar)) : "memory");
#endif
}
// One try (the hardware may hold the thread a while before answering false).
__device__ __forceinline__ bool MBarrierTryWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 1;
#if IRIS_SM90A_CODE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(SharedAddress(bar)), "r"(parity)
      : "memory");
#endif
  return done != 0;
}
// A wait that never ends is a broken hand-off protocol: after 2^26 tries (seconds) the kernel
// traps, so the launch fails with an error instead of holding the GPU.
__device__ __forceinline__ void MBarrierWait(uint64_t* bar, uint32_t parity) {
  for (uint32_t tries = 0; !MBarrierTryWait(bar, parity);) {
    if (++tries == (1u << 26)) __trap();
  }
}
// Waits until phase `phase` of bar has completed, counting from 0 at MBarrierInit (-1: the phase
// before, complete at once), by its parity — which names only the barrier's current phase and
// the one before it, so the caller must know bar is in phase `phase` or `phase + 1` (the SIMT
// twin checks it).
__device__ __forceinline__ void MBarrierWaitPhase(uint64_t* bar, int64_t phase) {
  MBarrierWait(bar, static_cast<uint32_t>(phase & 1));
}

// The copy engine lands map's box at (x = column, y = row) in dst (1024-byte aligned, the 128-byte
// swizzle applied), zeros where the box leaves the matrix, and completes the box's bytes on bar.
__device__ __forceinline__ void TmaLoad2d(void* dst, const TmaMap2d* map, int32_t x, int32_t y, uint64_t* bar) {
#if IRIS_SM90A_CODE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          SharedAddress(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(SharedAddress(bar))
      : "memory");
#endif
}

// The descriptor of a K-major bf16 tile in shared memory as the 128-byte-swizzled TMA box lays it
// out: rows of 64 values (128 bytes), groups of 8 rows 1024 bytes apart (the stride byte offset),
// the tile 1024-byte aligned. WgmmaDescAdvance moves its start along K (32 bytes: 16 values).
__device__ __forceinline__ WgmmaDesc WgmmaDescSw128(const void* tile) {
  const uint64_t addr = SharedAddress(tile);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ WgmmaDesc WgmmaDescAdvance(WgmmaDesc d, uint32_t bytes) { return d + (bytes >> 4); }

// Orders this thread's ordinary shared-memory writes before the copy engine's and the MMAs' reads
// of them (the "async proxy"): after filling a tile by hand, before the barrier and the MMA.
__device__ __forceinline__ void FenceProxyAsync() {
#if IRIS_SM90A_CODE
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// wgmma.fence: before a warpgroup's first MMA, and after its registers were last written otherwise.
__device__ __forceinline__ void WgmmaFence() {
#if IRIS_SM90A_CODE
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#if IRIS_SM90A_CODE
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Waits until at most the N newest committed groups are in flight: the older ones' accumulators
// are written and their shared-memory tiles read.
template <int N>
__device__ __forceinline__ void WgmmaWait() {
#if IRIS_SM90A_CODE
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving reads or writes of the accumulators across the asynchronous MMAs
// (before the first one and after the wait).
template <int R>
__device__ __forceinline__ void WgmmaHoldRegisters(float (&d)[R]) {
  IRIS_UNROLL
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A·B for a warpgroup (4 warps, 128 threads) on the tensor cores, asynchronously: A 64x16
// and B Nx16 (both K-major; N 128, 240 or 256) bf16 in shared memory by their descriptors, d 64xN f32
// in registers, N / 2 a thread. With thread t of the warpgroup, warp w = t / 32, lane = 4 * group + q:
//   d[4j + 0], d[4j + 1] = D[16w + group][8j + 2q, 8j + 2q + 1]
//   d[4j + 2], d[4j + 3] = D[16w + group + 8][8j + 2q, 8j + 2q + 1]      (j = 0..N/8 - 1)
// accumulate 0: d = A·B; 1: d += A·B.
template <int N>
__device__ __forceinline__ void WgmmaM64K16Bf16(float (&d)[N / 2], WgmmaDesc a, WgmmaDesc b, int accumulate);
template <>
__device__ __forceinline__ void WgmmaM64K16Bf16<128>(float (&d)[64], WgmmaDesc a, WgmmaDesc b, int accumulate) {
#if IRIS_SM90A_CODE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
#endif
}
template <>
__device__ __forceinline__ void WgmmaM64K16Bf16<256>(float (&d)[128], WgmmaDesc a, WgmmaDesc b, int accumulate) {
#if IRIS_SM90A_CODE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(accumulate));
#endif
}
template <>
__device__ __forceinline__ void WgmmaM64K16Bf16<240>(float (&d)[120], WgmmaDesc a, WgmmaDesc b, int accumulate) {
#if IRIS_SM90A_CODE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %122, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n240k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119}, "
      "%120, %121, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119])
      : "l"(a), "l"(b), "r"(accumulate));
#endif
}

}  // namespace iris::kernels::cuda

#else  // the host harness

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <cmath>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// Internal linkage: nvcc emits a host-side launch stub with each __global__ kernel's own name, so
// a test that links the CUDA objects (through an op's dispatch point) would otherwise get the
// stub in place of the harness's copy of the kernel.
#define IRIS_GLOBAL static inline
#define IRIS_DEVICE inline
#define IRIS_HOST_DEVICE inline
#define IRIS_SHARED static
#define IRIS_UNROLL
#define IRIS_LAUNCH_BOUNDS(threads, blocks)

namespace iris::kernels::cuda {

constexpr int kWarpSize = 32;

// The harness's float4: four floats read as one 16-byte load; and float2.
struct alignas(16) Float4 {
  float x, y, z, w;
};
struct alignas(8) Float2 {
  float x, y;
};

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  Dim3() = default;
  Dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT: as CUDA's dim3
  unsigned count() const { return x * y * z; }
};

namespace simt {

// A barrier of two atomics: each arrival (acq_rel) passes its thread's history to the last
// arrival, whose release of the next phase passes them all to every waiter — every arrival
// happens before every departure of the same phase, and nothing else, so that ThreadSanitizer
// (scripts/racecheck.sh) sees only the orderings the GPU has. libstdc++'s std::barrier waits
// through a pool of mutexes shared by unrelated objects, which ordered one warp's lanes after
// another's and hid races; it was also ~15% slower here (the SIMT suites: 184 s against 216 s on
// 2 cores). Waiters yield: the threads outnumber the cores.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
    const uint32_t phase = phase_.load(std::memory_order_relaxed);  // cannot move before this arrives
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
      arrived_.store(0, std::memory_order_relaxed);  // the next phase's arrivals see it after the phase
      phase_.store(phase + 1, std::memory_order_release);
      return;
    }
    while (phase_.load(std::memory_order_acquire) == phase) std::this_thread::yield();
  }

 private:
  const int count_;
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> phase_{0};
};

// A warp's lanes exchange values through here.
struct Warp {
  explicit Warp(int lanes) : sync(lanes) {}
  Barrier sync;
  alignas(8) unsigned char slot[kWarpSize][8];
  uint32_t mma_a[kWarpSize][4];  // MmaBf16's fragments, posted by each lane
  uint32_t mma_b[kWarpSize][2];
};

struct Block {
  explicit Block(int threads) : sync(threads) {}
  Barrier sync;
  std::vector<std::unique_ptr<Warp>> warps;
  unsigned char* dynamic_shared = nullptr;  // the launch's dynamic shared memory (1024-byte aligned)
  std::vector<std::unique_ptr<Barrier>> warpgroups;  // one per 128 threads (the wgmma twins')
};

// A CpAsync16 not yet landed: the copy happens at the CpAsyncWait that retires its group.
struct PendingCopy {
  void* dst;
  const void* src;
  bool valid;
};

// A thread's asynchronous operations in commit groups (cp.async's copies, wgmma's MMAs): issued
// open, closed into a group by a commit, and run in issue order by the wait that leaves at most
// `in_flight` closed groups pending.
template <typename Op>
struct AsyncGroups {
  struct Entry {
    Op op;
    int group;  // the commit that closed it; -1 while open
  };
  std::vector<Entry> pending;  // in issue order
  int commits = 0;             // groups closed so far in this block

  void Issue(const Op& op) { pending.push_back({op, -1}); }
  void Commit() {
    for (Entry& e : pending) {
      if (e.group < 0) e.group = commits;
    }
    ++commits;
  }
  template <typename Run>
  void Land(int in_flight, Run run) {
    std::vector<Entry> keep;
    for (const Entry& e : pending) {
      if (e.group >= 0 && e.group < commits - in_flight) {
        run(e.op);
      } else {
        keep.push_back(e);
      }
    }
    pending.swap(keep);
  }
  void Reset() {
    pending.clear();
    commits = 0;
  }
};

struct ThreadState {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
  Block* block = nullptr;
  Warp* warp = nullptr;
  int lane = 0;
  AsyncGroups<PendingCopy> copies;
};


inline thread_local ThreadState tls;

// Lands the thread's copies of every group but the newest `in_flight` closed ones.
inline void LandCopies(int in_flight) {
  tls.copies.Land(in_flight, [](const PendingCopy& c) {
    if (c.valid) {
      std::memcpy(c.dst, c.src, 16);
    } else {
      std::memset(c.dst, 0, 16);
    }
  });
}

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

// Blocks run one at a time here: a fence orders this thread's writes, the counter is an atomic
// add, and a plain load sees every finished block's writes.
inline void ThreadFence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int AtomicAddInt(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
inline float LoadCoherent(const float* p) { return *p; }
inline int32_t LoadCoherent(const int32_t* p) { return *p; }
// The harness runs launches one after another: every dependency is already met.
inline void GridDependencyWait() {}
inline void GridDependencyTrigger() {}
inline void PrefetchL2(const void*) {}
// The SFU's twin: exact exp2 with its flush of tiny results.
inline float Exp2Approx(float x) {
  const float y = std::exp2(x);
  return y < 0x1p-126f ? 0.f : y;
}
namespace simt {
// The harness records each PrefetchL2Bulk range while a test asks it to (tests check that a
// kernel asks for exactly the bytes it should, in pieces the instruction takes).
struct PrefetchRange {
  const void* p;
  uint32_t bytes;
};
struct PrefetchLog {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::vector<PrefetchRange> ranges;  // guarded by mu
};
inline PrefetchLog& Prefetches() {
  static PrefetchLog log;
  return log;
}
}  // namespace simt
inline void PrefetchL2Bulk(const void* p, uint32_t bytes) {
  simt::PrefetchLog& log = simt::Prefetches();
  if (!log.on.load()) return;
  std::lock_guard<std::mutex> lock(log.mu);
  log.ranges.push_back({p, bytes});
}

// MmaBf16's scalar twin (the layout is documented with the CUDA one above): the lanes post their
// fragments, each lane rebuilds A and B from the posted registers exactly as the hardware reads
// them and computes its own four results (bf16 products are exact in f32; f32 sums over k in
// order, then added to d), then waits until every lane has read before the slots are reused.
inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  simt::Warp& w = *simt::tls.warp;
  const int lane = simt::tls.lane;
  std::memcpy(w.mma_a[lane], a, sizeof(a));
  std::memcpy(w.mma_b[lane], b, sizeof(b));
  w.sync.arrive_and_wait();
  const auto element = [](uint32_t reg, int high) {
    const uint32_t bits = (high ? reg >> 16 : reg & 0xFFFFu) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  };
  const auto a_at = [&](int r, int k) {
    return element(w.mma_a[4 * (r % 8) + (k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  const auto b_at = [&](int k, int n) { return element(w.mma_b[4 * n + (k % 8) / 2][k >= 8 ? 1 : 0], k % 2); };
  const int group = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int r = group + 8 * (i / 2), n = 2 * t + i % 2;
    float sum = 0.f;
    for (int k = 0; k < 16; ++k) sum += a_at(r, k) * b_at(k, n);
    d[i] += sum;
  }
  w.sync.arrive_and_wait();
}

// The asynchronous copies: recorded at issue, landed at the wait that retires their group (so a
// kernel that reads a tile before waiting for it reads what was there before, as it could on
// the GPU).
inline void CpAsync16(void* dst, const void* src, bool valid) { simt::tls.copies.Issue({dst, src, valid}); }
inline void CpAsyncCommit() { simt::tls.copies.Commit(); }
template <int N>
void CpAsyncWait() {
  simt::LandCopies(N);
}

// LdMatrixX4's twin (the layout is documented with the CUDA one above): the lanes post their row
// addresses, each lane reads its values from the rows the hardware would give it.
namespace simt {
inline void LdMatrix(uint32_t (&r)[4], const void* row, bool trans) {
  Warp& w = *tls.warp;
  const int lane = tls.lane;
  std::memcpy(w.slot[lane], &row, sizeof(row));
  w.sync.arrive_and_wait();
  const auto row_of = [&](int i, int j) {
    const void* p;
    std::memcpy(&p, w.slot[8 * i + j], sizeof(p));
    return static_cast<const uint16_t*>(p);
  };
  const int group = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const uint16_t lo = trans ? row_of(i, 2 * t)[group] : row_of(i, group)[2 * t];
    const uint16_t hi = trans ? row_of(i, 2 * t + 1)[group] : row_of(i, group)[2 * t + 1];
    r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  w.sync.arrive_and_wait();
}
}  // namespace simt
inline void LdMatrixX4(uint32_t (&r)[4], const void* row) { simt::LdMatrix(r, row, false); }
inline void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) { simt::LdMatrix(r, row, true); }

// --- Hopper's twins (the CUDA versions above say what each does) ---
#define IRIS_SM90A_CODE 1
#define IRIS_GRID_CONSTANT

// The tensor map's twin: a bf16 matrix (cols x rows, row_bytes apart) and its box; the swizzle is
// always the 128-byte one (box_cols * 2 == 128).
struct TmaMap2d {
  const uint16_t* base = nullptr;
  uint64_t cols = 0, rows = 0, row_bytes = 0;
  uint32_t box_cols = 0, box_rows = 0;
};
// The descriptor's twin keeps the host address the hardware's 14-bit field cannot, and the fields
// WgmmaDescSw128 sets (checked where they are read).
struct WgmmaDesc {
  const unsigned char* start = nullptr;
  uint32_t leading_bytes = 0, stride_bytes = 0;
  int swizzle = 0;  // 1: 128 bytes (the PTX ISA's value)
};

namespace simt {
[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "SIMT harness: %s\n", what);
  std::abort();
}
// The 128-byte swizzle of a shared-memory address: its 16-byte chunk (bits 4-6) XOR its row of 8
// (bits 7-9); the tile is 1024-byte aligned, so these are the tile's own row and chunk.
inline const unsigned char* Swizzle128(const unsigned char* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<const unsigned char*>(a ^ (((a >> 7) & 7u) << 4));
}
// The barrier's state in its 8 bytes of shared memory: bit 63 the current phase's parity, bits
// 42-62 the bytes still expected, 32-41 the arrivals a phase takes, 22-31 those still missing,
// 0-21 the phases completed so far (what the hardware does not keep: the twin's check of
// MBarrierWaitPhase).
constexpr uint64_t kBarBytes = (uint64_t{1} << 21) - 1, kBarArrivals = (uint64_t{1} << 10) - 1,
                   kBarPhases = (uint64_t{1} << 22) - 1;
inline uint64_t BarrierWord(uint64_t parity, uint64_t bytes, uint64_t count, uint64_t missing, uint64_t phases) {
  return (parity << 63) | (bytes << 42) | (count << 32) | (missing << 22) | (phases & kBarPhases);
}
inline void BarrierUpdate(uint64_t* bar, int arrivals, int64_t tx) {
  std::atomic_ref<uint64_t> word(*bar);
  uint64_t old = word.load(std::memory_order_relaxed), next;
  do {
    const uint64_t count = (old >> 32) & kBarArrivals;
    int64_t missing = static_cast<int64_t>((old >> 22) & kBarArrivals) - arrivals;
    int64_t bytes = static_cast<int64_t>((old >> 42) & kBarBytes) + tx;
    uint64_t parity = old >> 63, phases = old & kBarPhases;
    if (missing < 0 || bytes < 0) Fail("mbarrier: more arrivals or bytes than the phase takes");
    if (missing == 0 && bytes == 0) {  // the phase completes
      missing = static_cast<int64_t>(count);
      parity ^= 1;
      ++phases;
    }
    next = BarrierWord(parity, static_cast<uint64_t>(bytes), count, static_cast<uint64_t>(missing), phases);
  } while (!word.compare_exchange_weak(old, next, std::memory_order_acq_rel, std::memory_order_relaxed));
}
}  // namespace simt

inline unsigned char* DynamicShared() { return simt::tls.block->dynamic_shared; }

inline void MBarrierInit(uint64_t* bar, int count) {
  if (count < 1 || static_cast<uint64_t>(count) > simt::kBarArrivals) simt::Fail("mbarrier: 1 to 1023 arrivals a phase");
  const auto c = static_cast<uint64_t>(count);
  std::atomic_ref<uint64_t>(*bar).store(simt::BarrierWord(0, 0, c, c, 0), std::memory_order_relaxed);
}
inline void MBarrierInitFence() {}
inline void MBarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) { simt::BarrierUpdate(bar, 1, bytes); }
inline void MBarrierArrive(uint64_t* bar) { simt::BarrierUpdate(bar, 1, 0); }
// A wait that has not completed in a minute never will (the CUDA side traps likewise): a hand-off
// that the two sides count differently fails the test instead of holding it until its timeout.
inline void MBarrierWait(uint64_t* bar, uint32_t parity) {
  const auto start = std::chrono::steady_clock::now();
  for (uint32_t tries = 1; (std::atomic_ref<uint64_t>(*bar).load(std::memory_order_acquire) >> 63) == parity; ++tries) {
    std::this_thread::yield();
    if (tries % 4096 == 0 && std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {
      simt::Fail("mbarrier: a wait did not complete in 60 s (the phase it waits for never completes)");
    }
  }
}
// The hardware's parity names only the barrier's current phase and the one before it: a wait for
// any other phase returns at once or waits for the wrong one. The twin knows the count, and fails
// such a wait as it happens.
inline void MBarrierWaitPhase(uint64_t* bar, int64_t phase) {
  const auto done = static_cast<int64_t>(std::atomic_ref<uint64_t>(*bar).load(std::memory_order_acquire) &
                                         simt::kBarPhases);
  if (phase > done) simt::Fail("mbarrier: a wait for a phase two or more ahead of the barrier (its parity names an earlier one)");
  if (phase < done - 1) simt::Fail("mbarrier: a wait for a phase two or more behind the barrier (its parity names a later one)");
  MBarrierWait(bar, static_cast<uint32_t>(phase & 1));
}

// The copy lands at once, on the issuing thread, and completes its bytes (the release that the
// waiters' acquire pairs with).
inline void TmaLoad2d(void* dst, const TmaMap2d* map, int32_t x, int32_t y, uint64_t* bar) {
  auto* out = static_cast<unsigned char*>(dst);
  if (reinterpret_cast<uintptr_t>(out) % 1024 != 0) simt::Fail("TMA: a 128-byte-swizzled box lands 1024-byte aligned");
  if (map->box_cols * 2 != 128) simt::Fail("TMA: the 128-byte swizzle takes boxes 128 bytes wide");
  if (x < 0 || y < 0) simt::Fail("TMA: negative coordinates are not used by iris");
  for (uint32_t r = 0; r < map->box_rows; ++r) {
    for (uint32_t c = 0; c < map->box_cols; ++c) {
      const uint64_t gx = static_cast<uint64_t>(x) + c, gy = static_cast<uint64_t>(y) + r;
      uint16_t v = 0;
      if (gx < map->cols && gy < map->rows) {
        v = *reinterpret_cast<const uint16_t*>(reinterpret_cast<const unsigned char*>(map->base) + gy * map->row_bytes +
                                               gx * 2);
      }
      std::memcpy(const_cast<unsigned char*>(simt::Swizzle128(out + r * 128 + c * 2)), &v, 2);
    }
  }
  simt::BarrierUpdate(bar, 0, -static_cast<int64_t>(map->box_rows) * map->box_cols * 2);
}

inline WgmmaDesc WgmmaDescSw128(const void* tile) {
  return {static_cast<const unsigned char*>(tile), 16, 1024, 1};
}
inline WgmmaDesc WgmmaDescAdvance(WgmmaDesc d, uint32_t bytes) {
  d.start += bytes;
  return d;
}

namespace simt {
// A wgmma issued and not yet retired: it runs at the WgmmaWait that retires its group (so a
// kernel that releases a tile before waiting reads what the copy engine put there since).
struct PendingWgmma {
  float* d;
  int n;  // B's rows (the MMA's N)
  WgmmaDesc a, b;
  int accumulate;
};
inline thread_local AsyncGroups<PendingWgmma> wgmmas;

// Element (row, k) of a K-major 128-byte-swizzled tile: rows 128 bytes apart within a group of 8,
// groups stride_bytes apart, the swizzle on the whole address (as the hardware's).
inline float SwizzledAt(const WgmmaDesc& t, int row, int k) {
  if (t.swizzle != 1 || t.stride_bytes != 1024) Fail("wgmma: only the 128-byte-swizzled K-major layout is twinned");
  const unsigned char* p = Swizzle128(t.start + (row / 8) * t.stride_bytes + (row % 8) * 128 + k * 2);
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline void RunWgmma(const PendingWgmma& op) {
  const int t = static_cast<int>(tls.thread_idx.x) % 128, w = t / 32, lane = t % 32;
  const int group = lane / 4, q = lane % 4;
  for (int j = 0; j < op.n / 8; ++j) {
    for (int i = 0; i < 4; ++i) {
      const int row = 16 * w + group + 8 * (i / 2), col = 8 * j + 2 * q + i % 2;
      float sum = 0.f;
      for (int k = 0; k < 16; ++k) sum += SwizzledAt(op.a, row, k) * SwizzledAt(op.b, col, k);
      op.d[4 * j + i] = op.accumulate ? op.d[4 * j + i] + sum : sum;
    }
  }
}

inline void LandWgmmas(int in_flight) { wgmmas.Land(in_flight, RunWgmma); }
}  // namespace simt

inline void FenceProxyAsync() {}
inline void WgmmaFence() {}
inline void WgmmaCommit() { simt::wgmmas.Commit(); }
// The MMA is one operation of the whole warpgroup: once a thread's wait returns, every thread's
// share of it has read its tiles (a thread then hands the tiles back for all), so the twin's wait
// is also a barrier of the warpgroup.
template <int N>
void WgmmaWait() {
  simt::LandWgmmas(N);
  const simt::ThreadState& s = simt::tls;
  const size_t wg = static_cast<size_t>(s.thread_idx.x) / 128;
  if (s.thread_idx.y != 0 || s.thread_idx.z != 0 || wg >= s.block->warpgroups.size()) {
    simt::Fail("wgmma: a warpgroup is 128 threads of a one-dimensional block");
  }
  s.block->warpgroups[wg]->arrive_and_wait();
}
template <int R>
void WgmmaHoldRegisters(float (&)[R]) {}
template <int N>
void WgmmaM64K16Bf16(float (&d)[N / 2], WgmmaDesc a, WgmmaDesc b, int accumulate) {
  static_assert(N == 128 || N == 240 || N == 256, "the MMAs iris twins");
  simt::wgmmas.Issue({d, N, a, b, accumulate});
}

// kernel<<<grid, block, shared_bytes>>>(args...): with dynamic shared memory (DynamicShared()),
// exactly that many bytes (so that ASan sees one past them).
template <typename... Params, typename... Args>
void LaunchShared(Dim3 grid, Dim3 block, size_t shared_bytes, void (*kernel)(Params...), Args&&... args) {
  const int threads = static_cast<int>(block.count());
  simt::Block b(threads);
  struct FreeAligned {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{1024}); }
  };
  std::unique_ptr<unsigned char[], FreeAligned> shared(
      shared_bytes > 0 ? static_cast<unsigned char*>(::operator new[](shared_bytes, std::align_val_t{1024})) : nullptr);
  b.dynamic_shared = shared.get();
  for (int g = 0; g + 128 <= threads; g += 128) b.warpgroups.push_back(std::make_unique<simt::Barrier>(128));
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
            CpAsyncCommit();  // copies a kernel never waited for still land (as on the GPU)
            simt::LandCopies(0);
            s.copies.Reset();
            if (!simt::wgmmas.pending.empty()) simt::Fail("wgmma: a kernel ended with MMAs it never waited for");
            simt::wgmmas.Reset();
            b.sync.arrive_and_wait();  // the block is done before the next one reuses its shared storage
          }
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
}

// kernel<<<grid, block>>>(args...), on the host: returns when every block has run.
template <typename... Params, typename... Args>
void Launch(Dim3 grid, Dim3 block, void (*kernel)(Params...), Args&&... args) {
  LaunchShared(grid, block, 0, kernel, std::forward<Args>(args)...);
}

}  // namespace iris::kernels::cuda

#endif
