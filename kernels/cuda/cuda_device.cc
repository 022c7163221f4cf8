#include "kernels/cuda/cuda_device.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/memory_plan.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "kernels/cuda/linear_kernels.h"

namespace iris::kernels::cuda {

// The startup memory estimate counts this workspace.
static_assert(CudaDevice::kMatmulWorkspaceBytes == static_cast<size_t>(core::kGpuMatmulWorkspaceBytes));

namespace {

std::string CudaError(cudaError_t e) { return absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"); }

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(absl::StrCat(what, ": ", CudaError(e)));
  return absl::InternalError(absl::StrCat(what, ": ", CudaError(e)));
}

std::string VersionString(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

absl::StatusOr<int64_t> Bytes(core::DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError("Allocate: negative dimension");
    if (d > 0 && n > std::numeric_limits<int64_t>::max() / 8 / d) {
      return absl::InvalidArgumentError("Allocate: the shape's size overflows");
    }
    n *= d;
  }
  return n * static_cast<int64_t>(core::DTypeSize(dtype));
}

}  // namespace

struct CudaDevice::State {
  int ordinal = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int cc_major = 0, cc_minor = 0;  // compute capability
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // kMatmulWorkspaceBytes
  int* split_counters = nullptr;  // sm_count ints, zero between launches
  std::mutex scratch_mu;
  void* scratch = nullptr;  // guarded by scratch_mu
  size_t scratch_bytes = 0;
  // Outgrown scratch buffers kept until the device goes, once a capture has begun: a graph
  // replays the address it recorded (guarded by scratch_mu).
  bool captured = false;
  std::vector<void*> retired;
  mutable std::mutex mu;
  absl::Status first_error;  // guarded by mu

  void Record(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    Keep(CudaStatus(e, what));
  }

  void Keep(absl::Status s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(s);
  }

  ~State() {
    cudaSetDevice(ordinal);
    if (scratch != nullptr) cudaFreeAsync(scratch, stream);
    for (void* p : retired) cudaFreeAsync(p, stream);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (workspace != nullptr) cudaFree(workspace);
    if (split_counters != nullptr) cudaFree(split_counters);
    if (lt != nullptr) cublasLtDestroy(lt);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  absl::Status Replay() override { return CudaStatus(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

absl::StatusOr<int> ParseCudaOrdinal(const std::string& name) {
  if (name == "cuda") return 0;
  int ordinal = -1;
  if (name.rfind("cuda:", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &ordinal) || ordinal < 0 ||
      name.find_first_not_of("0123456789", 5) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", name, "\": expected cuda or cuda:N with N a GPU's index (0, 1, ...)"));
  }
  return ordinal;
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal) {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const std::string versions = absl::StrCat("driver supports CUDA ", driver == 0 ? "none (no driver)" : VersionString(driver),
                                            ", this build's runtime is CUDA ", VersionString(runtime));
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device cuda:", ordinal, ": no usable NVIDIA GPU (", e != cudaSuccess ? CudaError(e) : "none found", "; ",
        versions, ")"));
  }
  if (ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device cuda:", ordinal, ": this machine has ", count, " GPU(s), cuda:0 to cuda:", count - 1));
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, ordinal); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("device cuda:", ordinal, ": ", CudaError(e)));
  }
  if (prop.major < 8) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "device cuda:%d (%s) has compute capability %d.%d; iris needs 8.0 or later (bf16)", ordinal, prop.name,
        prop.major, prop.minor));
  }
  auto state = std::make_shared<State>();
  state->ordinal = ordinal;
  // The context is made here: a GPU in exclusive-process mode that another process holds, or a
  // driver too old for the runtime, fails now with its own error rather than in a request.
  if (const cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("device cuda:", ordinal, ": ", CudaError(e), "; ", versions));
  }
  if (const cudaError_t e = cudaFree(nullptr); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("device cuda:", ordinal, " (", prop.name,
                                                      "): cannot create a context: ", CudaError(e), "; ", versions));
  }
  if (const cudaError_t e = cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaStatus(e, "cudaStreamCreateWithFlags");
  }
  // The stream-ordered pool keeps what is freed (no release threshold) so that a steady state of
  // allocations never goes back to the driver.
  if (const cudaError_t e = cudaDeviceGetDefaultMemPool(&state->pool, ordinal); e != cudaSuccess) {
    return CudaStatus(e, "cudaDeviceGetDefaultMemPool");
  }
  uint64_t keep_all = std::numeric_limits<uint64_t>::max();
  if (const cudaError_t e = cudaMemPoolSetAttribute(state->pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
      e != cudaSuccess) {
    return CudaStatus(e, "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
  if (const cublasStatus_t b = cublasLtCreate(&state->lt); b != CUBLAS_STATUS_SUCCESS) {
    state->lt = nullptr;
    return absl::FailedPreconditionError(absl::StrCat("device cuda:", ordinal, " (", prop.name,
                                                      "): cublasLtCreate failed: ", cublasLtGetStatusName(b), " (",
                                                      cublasLtGetStatusString(b), ")"));
  }
  if (const cudaError_t e = cudaMalloc(&state->workspace, kMatmulWorkspaceBytes); e != cudaSuccess) {
    state->workspace = nullptr;
    return CudaStatus(e, "cudaMalloc(cuBLASLt matmul workspace)");
  }
  state->sm_count = prop.multiProcessorCount;
  state->l2_bytes = prop.l2CacheSize;
  state->cc_major = prop.major;
  state->cc_minor = prop.minor;
  const size_t counter_bytes = sizeof(int) * static_cast<size_t>(state->sm_count);
  if (const cudaError_t e = cudaMalloc(&state->split_counters, counter_bytes); e != cudaSuccess) {
    state->split_counters = nullptr;
    return CudaStatus(e, "cudaMalloc(paged attention split counters)");
  }
  if (const cudaError_t e = cudaMemsetAsync(state->split_counters, 0, counter_bytes, state->stream); e != cudaSuccess) {
    return CudaStatus(e, "cudaMemsetAsync(paged attention split counters)");
  }
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  std::string description = absl::StrFormat(
      "cuda:%d: %s (sm_%d%d, %d SMs, %.1f GiB, %.1f GiB free; %s)", ordinal, prop.name, prop.major, prop.minor,
      prop.multiProcessorCount, total_bytes / double(1 << 30), free_bytes / double(1 << 30), versions);
  return std::unique_ptr<CudaDevice>(new CudaDevice(ordinal, std::move(state), std::move(description)));
}

CudaDevice::CudaDevice(int ordinal, std::shared_ptr<State> state, std::string description)
    : ordinal_(ordinal),
      state_(std::move(state)),
      description_(std::move(description)),
      gemv_max_rows_(kGemvMaxRowsPerLaunch),
      early_start_(state_->cc_major >= 9) {}

CudaDevice::~CudaDevice() = default;

absl::Status CudaDevice::SetAttention(Attention attention) {
  if (attention == Attention::kCudnn && sdpa_ == nullptr) {
    absl::StatusOr<std::unique_ptr<CudnnSdpa>> sdpa = CudnnSdpa::Create(*this);
    if (!sdpa.ok()) return sdpa.status();
    sdpa_ = std::move(*sdpa);
  }
  attention_ = attention;
  return absl::OkStatus();
}

absl::Status CudaDevice::SetGemvMaxRows(int rows) {
  if (rows < 0 || rows > kGemvMaxRowsPerLaunch) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemv max rows must be in [0, ", kGemvMaxRowsPerLaunch, "], got ", rows));
  }
  gemv_max_rows_ = rows;
  return absl::OkStatus();
}

absl::Status CudaDevice::SetHopperGemm(HopperGemmUse use) {
  if (use != HopperGemmUse::kOff && (state_->cc_major != 9 || state_->cc_minor != 0)) {
    return absl::FailedPreconditionError(absl::StrCat(description_, ": the Hopper GEMM needs compute capability 9.0 "
                                                                    "(its code is built for sm_90a only)"));
  }
  hopper_gemm_ = use;
  return absl::OkStatus();
}

absl::Status CudaDevice::SetHopperGemmTileN(int rows) {
  if (rows != 128 && rows != 256) {
    return absl::InvalidArgumentError(absl::StrCat("Hopper GEMM tile rows must be 128 or 256, got ", rows));
  }
  hopper_gemm_tile_n_ = rows;
  return absl::OkStatus();
}

absl::Status CudaDevice::SetFlashHeadsPerBlock(int heads) {
  if (heads != 1 && heads != 2) {
    return absl::InvalidArgumentError(absl::StrCat("flash heads per block must be 1 or 2, got ", heads));
  }
  flash_heads_per_block_ = heads;
  return absl::OkStatus();
}

std::optional<GemvKernel> CudaDevice::GemvFor(int64_t rows, int64_t out_features, int64_t in_features) const {
  if (forced_gemv_kernel_) {
    if (rows >= 1 && rows <= gemv_max_rows_) return forced_gemv_kernel_;
    return std::nullopt;
  }
  GemvKernel kernel;
  if (PickGemv(rows, out_features, in_features, gemv_max_rows_, &kernel)) return kernel;
  return std::nullopt;
}

CUstream_st* CudaDevice::stream() const { return state_->stream; }

int CudaDevice::sm_count() const { return state_->sm_count; }

int64_t CudaDevice::l2_bytes() const { return state_->l2_bytes; }

absl::Status CudaDevice::SetWeightPrefetchBytes(int64_t bytes) {
  if (bytes < 0 || bytes > state_->l2_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("weight prefetch bytes must be in [0, ", state_->l2_bytes,
                                                   "] (the L2), got ", bytes));
  }
  if (bytes > 0 && state_->cc_major < 9) {
    return absl::FailedPreconditionError(
        absl::StrCat(description_, ": weight prefetch needs compute capability 9.0 (bulk L2 prefetch)"));
  }
  weight_prefetch_bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status CudaDevice::SetPagedAttentionMaxSplits(int splits) {
  if (splits < 1 || splits > kPagedAttentionMaxSplits) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged attention max splits must be in [1, ", kPagedAttentionMaxSplits, "], got ", splits));
  }
  paged_attention_max_splits_ = splits;
  return absl::OkStatus();
}

absl::Status CudaDevice::SetEarlyStart(bool early) {
  if (early && state_->cc_major < 9) {
    return absl::FailedPreconditionError(absl::StrCat(description_, ": early start needs compute capability 9.0 "
                                                      "(programmatic dependent launch)"));
  }
  early_start_ = early;
  return absl::OkStatus();
}

absl::Status CudaDevice::status() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->first_error;
}

absl::StatusOr<DeviceMemory> CudaDevice::Memory() const {
  size_t free_bytes = 0, total_bytes = 0;
  cudaError_t e = cudaSetDevice(ordinal_);
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (e != cudaSuccess) return CudaStatus(e, "cudaMemGetInfo");
  return DeviceMemory{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

void CudaDevice::Check(int cuda_error, const char* op) { state_->Record(static_cast<cudaError_t>(cuda_error), op); }

void CudaDevice::Report(absl::Status error) { state_->Keep(std::move(error)); }

cublasLtContext* CudaDevice::blas_lt() const { return state_->lt; }

void* CudaDevice::matmul_workspace() const { return state_->workspace; }

int* CudaDevice::paged_split_counters() const { return state_->split_counters; }

void* CudaDevice::ActivationScratch(size_t bytes) {
  std::lock_guard<std::mutex> lock(state_->scratch_mu);
  if (bytes <= state_->scratch_bytes) return state_->scratch;
  if (Capturing()) {
    // A pool allocation inside a capture would belong to the graph; the buffer must outlive it.
    state_->Keep(absl::FailedPreconditionError(
        absl::StrCat("ActivationScratch: ", bytes, " bytes asked for inside a graph capture, ", state_->scratch_bytes,
                     " held; run the captured work once before capturing it")));
    return nullptr;
  }
  // Doubling bounds the number of regrowths while prefill sizes climb.
  const size_t grown = std::max(bytes, 2 * state_->scratch_bytes);
  void* p = nullptr;
  if (const cudaError_t e = cudaMallocFromPoolAsync(&p, grown, state_->pool, state_->stream); e != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky
    state_->Keep(absl::ResourceExhaustedError(absl::StrCat("out of GPU memory on cuda:", ordinal_, " growing the ",
                                                           "bf16 activation scratch to ", grown, " bytes: ",
                                                           CudaError(e))));
    return nullptr;
  }
  // Work already issued may still read the old buffer: it goes back to the pool in stream order,
  // or, if a graph may have recorded it, stays until the device goes (doubling bounds what is kept
  // to less than the current buffer).
  if (state_->scratch != nullptr) {
    if (state_->captured) {
      state_->retired.push_back(state_->scratch);
    } else {
      state_->Record(cudaFreeAsync(state_->scratch, state_->stream), "cudaFreeAsync");
    }
  }
  state_->scratch = p;
  state_->scratch_bytes = grown;
  return p;
}

bool CudaDevice::Capturing() const {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  state_->Record(cudaStreamIsCapturing(state_->stream, &capture), "cudaStreamIsCapturing");
  return capture != cudaStreamCaptureStatusNone;
}

void CudaDevice::AttachThread() { state_->Record(cudaSetDevice(ordinal_), "cudaSetDevice"); }

absl::StatusOr<core::Tensor> CudaDevice::Allocate(core::DType dtype, std::vector<int64_t> shape) {
  absl::StatusOr<int64_t> bytes = Bytes(dtype, shape);
  if (!bytes.ok()) return bytes.status();
  void* p = nullptr;
  if (*bytes > 0) {
    if (const cudaError_t e = cudaMallocFromPoolAsync(&p, static_cast<size_t>(*bytes), state_->pool, state_->stream);
        e != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky
      return absl::ResourceExhaustedError(absl::StrCat("out of GPU memory on cuda:", ordinal_, " allocating ",
                                                       *bytes, " bytes: ", CudaError(e)));
    }
  }
  // The memory goes back to the pool in stream order: work issued before the tensor died may
  // still read it.
  std::shared_ptr<State> state = state_;
  std::shared_ptr<const void> owner(p, [state](const void* q) {
    if (q != nullptr) state->Record(cudaFreeAsync(const_cast<void*>(q), state->stream), "cudaFreeAsync");
  });
  return core::Tensor::View(p, dtype, std::move(shape), std::move(owner), core::Device::kCuda);
}

absl::StatusOr<core::Tensor> CudaDevice::AllocateStaging(core::DType dtype, std::vector<int64_t> shape) {
  absl::StatusOr<int64_t> bytes = Bytes(dtype, shape);
  if (!bytes.ok()) return bytes.status();
  void* p = nullptr;
  if (*bytes > 0) {
    if (const cudaError_t e = cudaHostAlloc(&p, static_cast<size_t>(*bytes), cudaHostAllocDefault); e != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot pin ", *bytes, " bytes of host memory: ", CudaError(e)));
    }
  }
  std::shared_ptr<State> state = state_;
  std::shared_ptr<const void> owner(p, [state](const void* q) {
    if (q == nullptr) return;
    // Copies from or to it may still be in flight on the stream.
    state->Record(cudaStreamSynchronize(state->stream), "cudaStreamSynchronize");
    cudaFreeHost(const_cast<void*>(q));
  });
  return core::Tensor::View(p, dtype, std::move(shape), std::move(owner), core::Device::kCpu);
}

absl::StatusOr<core::Tensor> CudaDevice::Mirror(const core::Tensor& host) {
  if (host.device() != core::Device::kCpu) {
    return absl::InvalidArgumentError("Mirror: the source tensor must be in host memory");
  }
  absl::StatusOr<core::Tensor> t = Allocate(host.dtype(), host.shape());
  if (!t.ok()) return t.status();
  if (host.nbytes() > 0) {
    // The host tensor may be freed as soon as this returns: wait for the copy.
    cudaError_t e = cudaMemcpyAsync(t->data<void>(), host.data<void>(), host.nbytes(), cudaMemcpyHostToDevice,
                                    state_->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(state_->stream);
    if (e != cudaSuccess) return CudaStatus(e, "Mirror");
  }
  return t;
}

void CudaDevice::CopyToDevice(const void* host, void* device, size_t bytes) {
  if (bytes == 0) return;
  state_->Record(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, state_->stream), "CopyToDevice");
}

void CudaDevice::CopyToHost(const void* device, void* host, size_t bytes) {
  if (bytes == 0) return;
  state_->Record(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, state_->stream), "CopyToHost");
  state_->Record(cudaStreamSynchronize(state_->stream), "CopyToHost");
}

void CudaDevice::Synchronize() {
  state_->Record(cudaStreamSynchronize(state_->stream), "Synchronize");
  const absl::Status s = status();
  if (!s.ok()) std::fprintf(stderr, "iris: cuda:%d: %s\n", ordinal_, s.ToString().c_str());
}

absl::Status CudaDevice::BeginCapture() {
  {
    std::lock_guard<std::mutex> lock(state_->scratch_mu);
    state_->captured = true;
  }
  // Thread-local mode: only this thread's unsafe calls (e.g. a synchronous cudaMalloc) break
  // the capture, not other threads'.
  return CudaStatus(cudaStreamBeginCapture(state_->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}

absl::StatusOr<std::unique_ptr<DeviceGraph>> CudaDevice::EndCapture() {
  cudaGraph_t graph = nullptr;
  if (const cudaError_t e = cudaStreamEndCapture(state_->stream, &graph); e != cudaSuccess) {
    // A capture broken by a synchronising call inside it: the error names the call's kind.
    return CudaStatus(e, "cudaStreamEndCapture (a host synchronisation inside the captured region?)");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) return CudaStatus(e, "cudaGraphInstantiate");
  return std::unique_ptr<DeviceGraph>(new CudaGraph(exec, state_->stream));
}

}  // namespace iris::kernels::cuda
