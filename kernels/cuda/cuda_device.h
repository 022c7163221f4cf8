// The CUDA backend's device: one GPU, one stream every op is issued on, a stream-ordered memory
// pool (allocations and frees are ordered with the work, and freed memory is reused without a
// device-wide synchronisation), pinned host staging, graph capture of the stream, and what the
// Linear layers share: the cuBLASLt handle, its matmul workspace and a scratch buffer for
// activations converted to bf16. (cuDNN's handle joins it with the kernels that use it.)
//
// Copies and ops are asynchronous; CopyToHost waits for its copy (the caller reads the host
// buffer next). A CUDA error inside a void operation is kept (the first one) and reported by
// status() and by every later Synchronize on stderr: a failed launch leaves the stream unusable.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/linear_kernels.h"
#include "kernels/cuda/matmul_tuning.h"
#include "kernels/device.h"

struct CUstream_st;
struct cublasLtContext;

namespace iris::kernels::cuda {

class CudnnSdpa;

class CudaDevice final : public Device {
 public:
  // "cuda:<ordinal>": FAILED_PRECONDITION when no usable GPU is there (no driver, a driver older
  // than this build's runtime, a GPU busy in exclusive mode, compute capability below 8.0 — bf16
  // needs Ampere or later), INVALID_ARGUMENT for an ordinal past the GPUs present.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string Describe() const override { return description_; }

  absl::StatusOr<core::Tensor> Allocate(core::DType dtype, std::vector<int64_t> shape) override;
  absl::StatusOr<core::Tensor> AllocateStaging(core::DType dtype, std::vector<int64_t> shape) override;
  absl::StatusOr<core::Tensor> Mirror(const core::Tensor& host) override;

  void CopyToDevice(const void* host, void* device, size_t bytes) override;
  void CopyToHost(const void* device, void* host, size_t bytes) override;
  void Synchronize() override;
  void AttachThread() override;

  bool records_graphs() const override { return true; }
  // With matmul tuning on, every row bucket from kMatmulTuneMinRows up (MatmulTuneWarmUpRows).
  std::vector<int64_t> WarmUpRowCounts(int64_t max_rows) const override {
    return matmul_tuning_ ? MatmulTuneWarmUpRows(max_rows) : std::vector<int64_t>{max_rows};
  }
  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<DeviceGraph>> EndCapture() override;

  // The first CUDA error of a void operation, or OK.
  absl::Status status() const override;
  absl::StatusOr<DeviceMemory> Memory() const override;
  // Keeps a launch's cudaError_t value (0: success) as the device's first error, named by `op`:
  // the ops' dispatch points pass every cuda_kernels.h launch through it.
  void Check(int cuda_error, const char* op);

  // Keeps a failure that is not a cudaError_t (a cuBLASLt status, a refused request) as the
  // device's first error, as Check does.
  void Report(absl::Status error);

  int ordinal() const { return ordinal_; }
  int sm_count() const;  // streaming multiprocessors, for launch shapes that must fill the GPU
  int64_t l2_bytes() const;  // the L2 cache
  CUstream_st* stream() const;

  // The cuBLASLt handle, created with the device (on its GPU); every matmul goes on stream().
  cublasLtContext* blas_lt() const;
  // Device memory cuBLASLt may use during a matmul (kMatmulWorkspaceBytes). One buffer serves
  // every matmul: they are all ordered on the one stream.
  void* matmul_workspace() const;
  static constexpr size_t kMatmulWorkspaceBytes = size_t{32} << 20;  // what cuBLAS suggests for Hopper
  // sm_count() ints, zero between launches, for the kernels whose last block to finish merges
  // the others' results: paged attention's split arrivals per (row, head) (it splits only where
  // rows x heads <= sm_count / 2) and argmax's per row (it splits only up to sm_count rows).
  // Launches on the one stream never overlap, so they share it.
  int* paged_split_counters() const;
  // At least `bytes` of device memory for the activations a Linear converts to bf16, valid until
  // the next call (every Linear reuses it: their work is ordered on the one stream). It grows
  // when asked for more, the old buffer freed in stream order; growing is refused while the
  // stream is being captured (an engine warms up first): then nullptr, with the error kept. Once
  // a capture has begun, outgrown buffers are kept (a graph may replay their address).
  void* ActivationScratch(size_t bytes);

  // The varlen attention the bf16 compute mode runs (DeviceOptions::attention): iris's
  // tensor-core flash kernel, or cuDNN's SDPA operation where it takes the call (CudnnSdpa::Takes;
  // the flash kernel otherwise). Switching to kCudnn makes the cuDNN handle the first time:
  // FAILED_PRECONDITION when cuDNN cannot be used (the message says why). Benchmarks switch per run.
  enum class Attention { kFlash, kCudnn };
  Attention attention() const { return attention_; }
  absl::Status SetAttention(Attention attention);
  // cuDNN's SDPA, once kCudnn has been set (else null).
  CudnnSdpa* sdpa() const { return sdpa_.get(); }

  // bf16 Linears called with at most this many rows (a decode step's batch) may run one of iris's
  // GEMV kernels (linear_kernels.h) instead of cuBLASLt: they stream the weight and round x to
  // bf16 as they read it, with no conversion launch. Which, and where: PickGemv (by rows and
  // weight shape), unless a kernel is forced, which then takes every call of up to this many
  // rows. 0: cuBLASLt always. INVALID_ARGUMENT past kGemvMaxRowsPerLaunch. Benchmarks and tests
  // switch both per run.
  int gemv_max_rows() const { return gemv_max_rows_; }
  absl::Status SetGemvMaxRows(int rows);
  const std::optional<GemvKernel>& forced_gemv_kernel() const { return forced_gemv_kernel_; }
  void ForceGemvKernel(std::optional<GemvKernel> kernel) { forced_gemv_kernel_ = kernel; }
  // The GEMV a bf16 Linear of `rows` rows and an [out_features, in_features] weight runs, or
  // none (cuBLASLt).
  std::optional<GemvKernel> GemvFor(int64_t rows, int64_t out_features, int64_t in_features) const;

  // For measurement only (decode_bench's step breakdown: what each op costs inside a
  // graph-replayed step, as the step's time with that op's launches issued twice minus its time
  // without): the launches of one op are issued `times` times back to back. kGemv picks the GEMVs
  // of one weight shape [out, in] (a decode step's qkv, o, gate_up, down or lm_head); kDecodeRotary
  // a step's rotary + KV write launch (RotaryQKWritePagedKv); kPagedAttention the decode rows'
  // paged attention (either kernel, the rotary inside it or not). The paged attention gives the
  // same output however often it runs; a repeated accumulating GEMV or in-place rotary does not:
  // time only. Graphs record the setting they were made with (EnableDecodeGraphs again after a
  // change).
  enum class RepeatedOp { kNone, kGemv, kDecodeRotary, kPagedAttention };
  struct LaunchRepeat {
    RepeatedOp op = RepeatedOp::kNone;
    int64_t out = 0, in = 0;  // kGemv's weight shape
    int times = 1;
  };
  void SetLaunchRepeat(const LaunchRepeat& repeat) { launch_repeat_ = repeat; }
  // How many times to issue a launch of `op` (a GEMV's: of weight [out, in]): 1 but where the
  // repeat set above names it.
  int LaunchesOf(RepeatedOp op, int64_t out = 0, int64_t in = 0) const {
    const LaunchRepeat& r = launch_repeat_;
    const bool named = r.op == op && (op != RepeatedOp::kGemv || (r.out == out && r.in == in));
    return named && r.times > 1 ? r.times : 1;
  }

  // Whether bf16 Linears fold the op before them (LinearInput: the RMSNorm before qkv and
  // gate_up, the SiLU·mul before down) into their read of x: the GEMVs apply it as they load x,
  // and before cuBLASLt the op writes the matmul's bf16 rows itself (no f32 pass, no conversion
  // launch). On by default; benchmarks switch it off to measure it.
  bool fold_linear_inputs() const { return fold_linear_inputs_; }
  void SetFoldLinearInputs(bool fold) { fold_linear_inputs_ = fold; }

  // Whether ops hand an intermediate to the next one as the bf16 rows it reads, for
  // matmul-sized rows with bf16 compute: kernels::GatedMlp's gate_up output goes to the SiLU·mul
  // as bf16 rows (cuBLASLt's bf16 output; GatedMlpBf16Handoff, with inputs folded), half the
  // bytes of a block's largest activation, for one more bf16 rounding of gate and up; and
  // kernels::AttendAndProject's flash kernel writes proj's bf16 input rows itself
  // (AttendAndProjectBf16Handoff: the same values, no f32 output and no conversion launch). On by
  // default; not yet timed on a GPU (encoder_bench's "bf16 hand-off off" column, decode_bench
  // --bf16_handoff).
  bool bf16_handoff() const { return bf16_handoff_; }
  void SetBf16Handoff(bool handoff) { bf16_handoff_ = handoff; }

  // Whether iris's flash attention on bf16 q/k/v rows (the qkv chain in bf16) runs its pipelined
  // kernel (FlashVarlenParams::pipeline: the next K/V tile copied to shared memory while the
  // warps compute on this one; the same result bit for bit). On by default: on an H200 it took
  // 6-15% off every encoder_bench input (its "flash unpipelined" column times the other).
  bool flash_pipeline() const { return flash_pipeline_; }
  void SetFlashPipeline(bool pipeline) { flash_pipeline_ = pipeline; }
  // How many consecutive q heads a block of the pipelined flash kernel walks, 1 or 2
  // (FlashVarlenParams::heads_per_block: 2 overlaps the next head's first tile's copy with this
  // head's last tile, for the vision tower's one-tile windows). 1 by default until a GPU has timed
  // it (encoder_bench's "flash 2 heads a block" column). INVALID_ARGUMENT otherwise.
  int flash_heads_per_block() const { return flash_heads_per_block_; }
  absl::Status SetFlashHeadsPerBlock(int heads);

  // Whether a step's prefill rows (sequences of more than one query row) attend on the tensor
  // cores (kernels/cuda/paged_flash_mma.cuh: 64 rows a block, the bf16 compute mode's numerics,
  // bf16 pages) rather than a block per (row, head) on the CUDA cores, which walks the context
  // again for every row of a chunk. Decode rows keep their kernel either way. On by default; not
  // yet timed on a GPU (decode_bench --paged_prefill_mma=false measures the other).
  bool paged_prefill_mma() const { return paged_prefill_mma_; }
  void SetPagedPrefillMma(bool mma) { paged_prefill_mma_ = mma; }

  // Whether a step of decode rows only has its rotary and KV write done by the paged attention
  // (kernels::RotaryPagedAttention: the CUDA-core kernel, or the packed tensor-core one where its
  // key slices apply: one launch a layer fewer, the same results bit for bit) or by a launch of
  // their own, the default: on an H200 the fused steps were no faster at 3b batches 1 and 8 and
  // 5-8% slower at 32 and 64 (decode_bench --decode_rotary times both).
  bool fused_decode_rotary() const { return fused_decode_rotary_; }
  void SetFusedDecodeRotary(bool fused) { fused_decode_rotary_ = fused; }

  // Whether a step of decode rows only has its rotary and KV write done by the qkv projection's
  // GEMV as its epilogue (kernels::ProjectQkvRotaryWriteKv: where the step's rows run a CUDA-core
  // GEMV, i.e. up to 4 rows; a block owns four rotary pairs, so a pair's two sums meet in one block):
  // one launch a layer fewer than the separate launch, and no round trip of q and k through memory;
  // the same values bit for bit. Off by default until a same-run step measurement says so
  // (decode_bench --decode_rotary=gemv); it takes precedence over fused_decode_rotary where both
  // are set.
  bool qkv_gemv_rotary() const { return qkv_gemv_rotary_; }
  void SetQkvGemvRotary(bool on) { qkv_gemv_rotary_ = on; }

  // Whether the CUDA-core paged attention takes its lean kernel where a step's grid holds more
  // blocks than the GPU has SMs (a large decode batch: 3b at 32 rows is 512 blocks): at most 128
  // registers a thread, so two blocks share an SM where the default kernel (155-178 registers)
  // holds one, its V rows read 8 at a time instead of 16; the same output bit for bit (bf16 or f32
  // pages in whole 16-byte chunks, no fused rotary). Off by default until a same-run step
  // measurement says so (decode_bench --paged_attention_lean; its table times both at every batch).
  bool paged_attention_lean() const { return paged_attention_lean_; }
  void SetPagedAttentionLean(bool on) { paged_attention_lean_ = on; }

  // At most how many blocks the CUDA-core paged attention splits one decode row's keys over, per
  // q head (cuda_kernels.h's PagedAttentionSplits: as many as fill one wave, at most this). 4 by
  // default: on an H200 the 3b batch-1 step (context 512) took 2.27-2.28 ms with 4, 2.33 with the
  // kernel's own cap of 16 (8 splits) and 2.55-2.58 with 1 (same run, graph-replayed): fewer
  // splits walk more key tiles a block, more merge more partials through global memory
  // (decode_bench --paged_attention_max_splits). INVALID_ARGUMENT outside [1, 16].
  int paged_attention_max_splits() const { return paged_attention_max_splits_; }
  absl::Status SetPagedAttentionMaxSplits(int splits);

  // How a step's decode rows attend in the bf16 mode over bf16 pages: kCudaCores, a block per
  // (row, q head) (kernels.cuh's PagedAttentionKernel, the default); kTensorCores, where the rows
  // are more (row, q head) pairs than the GPU has SMs (a large batch), on the tensor cores with a
  // kv head's q heads as one tile's rows (paged_flash_mma.cuh's PagedDecodeMmaKernel: a block per
  // (row, kv head), the row's keys read once for all its q heads, split over blocks where few);
  // kTensorCoresEveryBatch, that kernel at every batch (to time it). The tensor-core kernel has
  // the bf16 mode's numerics (q and the probabilities rounded to bf16). kCudaCores until a GPU
  // has timed the other (decode_bench --decode_attention, which times both in the same run).
  enum class DecodeAttention { kCudaCores, kTensorCores, kTensorCoresEveryBatch };
  DecodeAttention decode_attention() const { return decode_attention_; }
  void SetDecodeAttention(DecodeAttention a) { decode_attention_ = a; }
  // Whether `rows` decode rows of `num_heads` q heads go to the tensor-core kernel under it.
  bool DecodeOnTensorCores(int64_t rows, int num_heads) const {
    return decode_attention_ == DecodeAttention::kTensorCoresEveryBatch ||
           (decode_attention_ == DecodeAttention::kTensorCores && rows * num_heads > sm_count());
  }

  // Whether the GEMVs, the decode rotary + KV write and the paged attention are launched to start
  // early (programmatic dependent launch, sm_90 and later: LaunchGemvBf16's,
  // LaunchRotaryQKWritePagedKv's and LaunchPagedAttention's `early`), so that a decode step's
  // weight stream, and the attention's first keys, are read while the kernel ahead finishes, and
  // the rotary's launch overlaps the qkv projection's end. On by default where the GPU has it (H200, 3b batch-1 step, GEMVs alone: 2.43 ->
  // 2.37 ms); FAILED_PRECONDITION below compute capability 9.0.
  bool early_start() const { return early_start_; }
  absl::Status SetEarlyStart(bool early);

  // Whether cuBLASLt matmuls of at least kMatmulTuneMinRows rows run the fastest of the
  // heuristic's candidates, timed on the first call of each shape and row bucket outside a graph
  // capture (kernels/cuda/matmul_tuning.h), instead of the heuristic's first pick. The timing
  // waits on the host once per tuned shape (a warm-up's, normally), and a choice may differ in
  // f32 summation order from the untuned one. Off by default until a GPU has timed it
  // (encoder_bench's "matmul tuned" column).
  bool matmul_tuning() const { return matmul_tuning_; }
  void SetMatmulTuning(bool tuning) { matmul_tuning_ = tuning; }
  // The algorithms tuning chose, shared by every Linear of this device.
  MatmulAlgoTable& matmul_algos() const { return *matmul_algos_; }
  // Which bf16 matmuls of at least kHopperGemmMinRows rows run iris's own Hopper GEMM
  // (kernels/cuda/hopper_gemm.h: the copy engine and warpgroup MMAs, f32 accumulation) in place of
  // cuBLASLt: kOff; kSwiGlu, the gated MLP's gate_up with the SiLU·mul as its epilogue
  // (GatedMlpBf16Handoff: gate_up's output never reaches memory and the SiLU·mul launch is gone);
  // kAll, that and every other bf16 matmul without a GELU (f32 rows with the bias and residual
  // add, bf16 rows). Off by default: never yet run on a GPU (encoder_bench's "hopper GEMM"
  // columns time both). FAILED_PRECONDITION unless the GPU is compute capability 9.0 (its code
  // is sm_90a's alone).
  enum class HopperGemmUse { kOff, kSwiGlu, kAll };
  static constexpr int64_t kHopperGemmMinRows = 128;
  HopperGemmUse hopper_gemm() const { return hopper_gemm_; }
  absl::Status SetHopperGemm(HopperGemmUse use);
  // The weight rows a Hopper GEMM block multiplies, 128 (the default) or 256 (twice the MMA work
  // per byte of activations brought in, 128 accumulators a thread, fewer blocks: a GPU's
  // measurement decides; encoder_bench's matmul table times both). INVALID_ARGUMENT otherwise.
  int hopper_gemm_tile_n() const { return hopper_gemm_tile_n_; }
  absl::Status SetHopperGemmTileN(int rows);
  // Whether the Hopper GEMM runs persistent (the default): as many blocks as SMs, each taking
  // tiles in turn, the copy engine landing a tile's first K slices while the MMA warpgroups write
  // the last one out; else a block per tile (its first form, kept to compare and to tell a
  // hand-off fault of the persistent loop from one of the kernel).
  bool hopper_gemm_persistent() const { return hopper_gemm_persistent_; }
  void SetHopperGemmPersistent(bool on) { hopper_gemm_persistent_ = on; }
  // Whether the Hopper GEMM hands the residual stream's next RMSNorm on (kernels::RmsNormHandoff;
  // under kAll, where both the GEMM writing the stream and the one reading the norm run on it):
  // the writer leaves bf16 rows of the stream times the norm's weight and partial sums of squares,
  // and the reader scales its product's rows by the norm's factor, so no norm launch reads the
  // stream again. On by default (it applies only under kAll); off: the norm kernel, to compare.
  bool rms_norm_handoff() const { return rms_norm_handoff_; }
  void SetRmsNormHandoff(bool on) { rms_norm_handoff_ = on; }
  // Whether a bf16 matmul of m rows runs the Hopper GEMM: the gated MLP's fused gate_up (swiglu)
  // or any other.
  bool UsesHopperGemm(int64_t m, bool swiglu) const {
    return m >= kHopperGemmMinRows &&
           (hopper_gemm_ == HopperGemmUse::kAll || (swiglu && hopper_gemm_ == HopperGemmUse::kSwiGlu));
  }

  // Whether stream() is being captured into a graph now (no host waits, no allocations then).
  bool Capturing() const;

  // How much of the weights of the Linears after a decode step's attention that step asks into the
  // L2 while the attention runs (kernels::PrefetchWeights: the attention is latency-bound, HBM
  // idles). 0, the default, asks for nothing: not yet timed on a GPU (decode_bench
  // --weight_prefetch measures it). INVALID_ARGUMENT past l2_bytes(); FAILED_PRECONDITION for
  // non-zero below compute capability 9.0.
  int64_t weight_prefetch_bytes() const { return weight_prefetch_bytes_; }
  absl::Status SetWeightPrefetchBytes(int64_t bytes);

 private:
  struct State;
  CudaDevice(int ordinal, std::shared_ptr<State> state, std::string description);

  int ordinal_;
  // Shared with every tensor this device allocated: memory freed after the device object is
  // gone still goes back through the stream and pool it came from.
  std::shared_ptr<State> state_;
  std::string description_;
  Attention attention_ = Attention::kFlash;
  int gemv_max_rows_;
  std::optional<GemvKernel> forced_gemv_kernel_;
  bool fold_linear_inputs_ = true;
  bool bf16_handoff_ = true;
  bool flash_pipeline_ = true;
  int flash_heads_per_block_ = 1;
  bool paged_prefill_mma_ = true;
  DecodeAttention decode_attention_ = DecodeAttention::kCudaCores;
  bool fused_decode_rotary_ = false;
  bool qkv_gemv_rotary_ = false;
  bool paged_attention_lean_ = false;
  int paged_attention_max_splits_ = 4;
  LaunchRepeat launch_repeat_;
  bool early_start_;
  int64_t weight_prefetch_bytes_ = 0;
  bool matmul_tuning_ = false;
  HopperGemmUse hopper_gemm_ = HopperGemmUse::kOff;
  int hopper_gemm_tile_n_ = 128;
  bool hopper_gemm_persistent_ = true;
  bool rms_norm_handoff_ = true;
  std::unique_ptr<MatmulAlgoTable> matmul_algos_ = std::make_unique<MatmulAlgoTable>();
  std::unique_ptr<CudnnSdpa> sdpa_;
};

// The CUDA device behind a Device of kind kCuda (the dispatch points' counterpart of cpu::AsCpu).
inline CudaDevice& AsCuda(Device& device) { return static_cast<CudaDevice&>(device); }

// "cuda" -> 0, "cuda:N" -> N; INVALID_ARGUMENT for anything else.
absl::StatusOr<int> ParseCudaOrdinal(const std::string& name);

}  // namespace iris::kernels::cuda
