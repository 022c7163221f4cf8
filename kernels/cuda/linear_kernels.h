// Launches of the CUDA Linear's small kernels and the read-bandwidth probe (linear_kernels.cuh)
// on a stream. Pointers are device memory; each call only enqueues and returns the launch's
// cudaError_t value (0: cudaSuccess), so that this header needs no CUDA header.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace iris::kernels::cuda {

// out[r * ld + c] = bf16 bits of x[r * cols + c] (core::FloatToBf16's rounding); ld >= cols.
int LaunchToBf16Rows(CUstream_st* stream, const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out);
// y[r, c] = gelu_erf(y[r, c] + bias[c]) in place; bias may be null.
int LaunchBiasGeluErf(CUstream_st* stream, float* y, int64_t rows, int64_t cols, const float* bias);
// The most rows of x LaunchGemvBf16 takes (linear_kernels.cuh's kGemvMaxRows).
constexpr int kGemvMaxRowsPerLaunch = 8;
// Which GEMV: on the CUDA cores (a warp streams 512 contiguous bytes of a weight row per load;
// rows x 8 FMAs per 16 bytes of weight; a block per group of 8 outputs), the same streamed (as
// many blocks as fit on the GPU at once, each walking many groups with its next loads in flight:
// gemv_streamed.cuh; an x that is not whole 16-byte vectors takes kCudaCores), or on the tensor
// cores (two m16n8k16 products per 16 bytes a lane loads of two weight rows, whatever the rows).
// kCudaCoresPipelined: kCudaCores with each lane's next pass of weight loads in flight while it
// multiplies the current one (rows of more than 2048 columns take several passes); the same y bit
// for bit. A candidate: not picked by PickGemv until a same-run step measurement says so.
enum class GemvKernel { kCudaCores, kCudaCoresStreamed, kTensorCores, kCudaCoresPipelined };
// Which path a bf16 Linear of `rows` rows and an [out_features, in_features] weight takes, as
// measured on an H200 (README): a GEMV for one row (every shape of the 3b decoder, 1.1-2.4x the
// bandwidth cuBLASLt reaches), on the CUDA cores (the streamed one read the MLP's down faster
// alone, 3486 against 2933 GB/s, but its 3b batch-1 step was 1.3% slower: 2.33 against 2.30 ms,
// same run); for 2..max_rows rows only weights of at most
// 32 MiB (qkv, o), on the CUDA cores up to 4 rows and on the tensor cores past that, where
// cuBLASLt has too few tiles to fill the GPU; cuBLASLt for larger weights and past max_rows.
// False: cuBLASLt.
bool PickGemv(int64_t rows, int64_t out_features, int64_t in_features, int max_rows, GemvKernel* kernel);
// The op a GEMV applies to its input rows as it reads them (kernels/linear.h's LinearInput ops),
// each value computed as the op's own kernel computes it (kernels.cuh; row_math.cuh).
enum class GemvX {
  kPlain,    // x: [rows, in]
  kRmsNorm,  // x: [rows, in], normalised with norm_weight [in] and eps (RmsNorm)
  kSiluMul,  // x: [rows, 2 in], gate then up: silu(gate) * up (SiluMulRows)
};
struct GemvInput {
  const float* x = nullptr;
  GemvX op = GemvX::kPlain;
  const float* norm_weight = nullptr;
  float eps = 0.f;
  int norm_threads = 0;  // kRmsNorm: the norm kernel's block size for `in`; LaunchGemvBf16 sets it
};
// Whether LaunchGemvBf16 can apply x.op for rows of `in` values: always for kPlain; the folded
// ops want whole 16-byte vectors (x and norm_weight 16-byte aligned, in % 8 == 0) and, for
// kRmsNorm, rows the norm's vector kernel takes (row_math.cuh's RmsNormVecThreads).
bool GemvTakes(const GemvInput& x, int64_t in);
// y[r, o] = beta * y[r, o] + bias[o] + op(x)[r, :] (rounded to bf16) · w[o, :] for r < rows (1 ..
// kGemvMaxRowsPerLaunch), o < out: w bf16 bits [out, ld], 16-byte aligned, ld % 8 == 0, columns
// [in, ld) zero; x as GemvInput says; y [rows, out] (not read when beta == 0); bias may be null.
// cudaErrorInvalidValue where !GemvTakes(x, in). sm_count: the GPU's SMs (CudaDevice::sm_count),
// sizing the streamed kernel's grid. early (sm_90 and later): launched with programmatic stream
// serialization, so that its blocks may start while the kernel ahead of it on the stream
// finishes, reading their first weight pass before they wait for it (linear_kernels.cuh).
int LaunchGemvBf16(CUstream_st* stream, GemvKernel kernel, const uint16_t* w, int64_t ld, int64_t in, int64_t out,
                   GemvInput x, int64_t rows, const float* bias, float beta, float* y, int sm_count,
                   bool early = false);
// A decode step's rotary and KV write, done by the qkv GEMV as its epilogue (LaunchGemvBf16RotaryKv):
// the q and k heads' pairs (i, i + head_dim / 2) of each row rotated by the row's cos/sin, and the
// rotated k and the v values stored into pool slot slots[r] (skipped where the slot is outside
// [0, num_slots)), as LaunchRotaryQKWritePagedKv (cuda_kernels.h) would after the plain GEMV.
struct GemvRotaryKv {
  int q_heads = 0, k_heads = 0, head_dim = 0;
  const float* cos = nullptr;  // [rows, head_dim / 2]
  const float* sin = nullptr;
  const int64_t* slots = nullptr;  // [rows]
  int64_t num_slots = 0;
  void* k_pool = nullptr;  // [num_slots, k_heads * head_dim], bf16 (bf16_pool) or f32
  void* v_pool = nullptr;
  bool bf16_pool = false;
};
// The most rows the rotary GEMV takes (the CUDA-core GEMV's share of PickGemv).
constexpr int kGemvRotaryKvMaxRows = 4;
// Whether LaunchGemvBf16RotaryKv takes this call: a CUDA-core kernel (plain or pipelined), 1 ..
// kGemvRotaryKvMaxRows rows, a head dim that is a multiple of 8 (four pairs a block), out equal
// to (q_heads + 2 k_heads) * head_dim, x plain or RMSNorm-folded in whole 16-byte vectors
// (GemvTakes), and the usual weight layout (ld % 8 == 0, 16-byte aligned).
bool GemvRotaryKvTakes(GemvKernel kernel, const uint16_t* w, int64_t ld, int64_t in, int64_t out, const GemvInput& x,
                       int64_t rows, const GemvRotaryKv& rot);
// y = op(x) · wᵀ + bias (y [rows, out], written: no accumulate), then rot's rotary and KV write
// (linear_kernels.cuh's GemvSimtRotaryKvKernel): the values of LaunchGemvBf16 with the same kernel
// followed by LaunchRotaryQKWritePagedKv, bit for bit, in one launch. cudaErrorInvalidValue where
// !GemvRotaryKvTakes. early: as LaunchGemvBf16's.
int LaunchGemvBf16RotaryKv(CUstream_st* stream, GemvKernel kernel, const uint16_t* w, int64_t ld, int64_t in,
                           int64_t out, GemvInput x, int64_t rows, const float* bias, float* y,
                           const GemvRotaryKv& rot, bool early = false);
// Asks the L2 for bytes [p, p + bytes) (p 16-byte aligned; bytes rounded down to a multiple of
// 16), a hint that changes no value (sm_90 and later; below, a launch that asks for nothing).
// early: launched with programmatic stream serialization; the kernel waits for the one ahead
// before it ends either way, so the kernels behind see the same order (linear_kernels.cuh).
int LaunchPrefetchL2(CUstream_st* stream, const void* p, int64_t bytes, bool early);
// partials[b] for b < blocks: block b's share of the sum of x[0, n) (x 16-byte aligned, n a
// multiple of 4), 256 threads a block.
int LaunchReadSum(CUstream_st* stream, const float* x, int64_t n, int blocks, float* partials);

}  // namespace iris::kernels::cuda
