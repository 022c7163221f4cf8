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
// LdMatrixX4()/LdMatrixX4Trans() (a warp's fragment loads from shared memory),
// threadIdx/blockIdx/blockDim/gridDim (x, y, z), kWarpSize, and Launch for the host side.
// Every thread of a block must reach each SyncThreads (as CUDA requires), and a block's size is a
// multiple of the warp size when it shuffles.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)

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

// Four floats read as one 16-byte load (the address is 16-byte aligned).
using Float4 = float4;

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

}  // namespace iris::kernels::cuda

#else  // the host harness

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <cmath>
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
#define IRIS_UNROLL
#define IRIS_LAUNCH_BOUNDS(threads, blocks)

namespace iris::kernels::cuda {

constexpr int kWarpSize = 32;

// The harness's float4: four floats read as one 16-byte load.
struct alignas(16) Float4 {
  float x, y, z, w;
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
};

// A CpAsync16 not yet landed: the copy happens at the CpAsyncWait that retires its group.
struct PendingCopy {
  void* dst;
  const void* src;
  bool valid;
  int group;  // the commit that closed it; -1 while open
};

struct ThreadState {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
  Block* block = nullptr;
  Warp* warp = nullptr;
  int lane = 0;
  std::vector<PendingCopy> copies;  // in issue order
  int commits = 0;                  // groups closed so far in this block
};


inline thread_local ThreadState tls;

// Lands the thread's copies of every group but the newest `in_flight` closed ones.
inline void LandCopies(int in_flight) {
  ThreadState& s = tls;
  std::vector<PendingCopy> keep;
  for (const PendingCopy& c : s.copies) {
    if (c.group >= 0 && c.group < s.commits - in_flight) {
      if (c.valid) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    } else {
      keep.push_back(c);
    }
  }
  s.copies.swap(keep);
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
inline void CpAsync16(void* dst, const void* src, bool valid) { simt::tls.copies.push_back({dst, src, valid, -1}); }
inline void CpAsyncCommit() {
  simt::ThreadState& s = simt::tls;
  for (simt::PendingCopy& c : s.copies) {
    if (c.group < 0) c.group = s.commits;
  }
  ++s.commits;
}
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
            CpAsyncCommit();  // copies a kernel never waited for still land (as on the GPU)
            simt::LandCopies(0);
            s.commits = 0;
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
