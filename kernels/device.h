// The device seam: one object per device holds everything a backend keeps between ops — its
// memory, its stream (on the CPU: the thread team), library handles and workspaces — and every
// op takes it. Model code calls ops on a Device and never names a backend; each op has one
// dispatch point (kernels/<op>.cc) that picks the implementation for the device's kind and
// instruction set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/compute_share.h"

namespace iris::kernels {

enum class DeviceKind { kCpu, kCuda };

// A device's memory as the memory plan sees it (bytes).
struct DeviceMemory {
  int64_t free_bytes = 0;   // what this process can still take
  int64_t total_bytes = 0;  // the device's size (the CPU: the same as free)
};

// A recorded sequence of ops that can be replayed at the same addresses (a CUDA graph).
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual absl::Status Replay() = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceKind kind() const = 0;
  // One line for logs and benchmark reports: the backend, the processor, the code path in use.
  virtual std::string Describe() const = 0;

  // Device memory, 64-byte aligned, at a fixed address for the tensor's life (tagged with the
  // device in Tensor::device()). Uninitialised. RESOURCE_EXHAUSTED when it cannot be had.
  virtual absl::StatusOr<core::Tensor> Allocate(core::DType dtype, std::vector<int64_t> shape) = 0;
  // Host memory that copies to and from the device fastest (pinned on a GPU).
  virtual absl::StatusOr<core::Tensor> AllocateStaging(core::DType dtype, std::vector<int64_t> shape) = 0;
  // A device copy of a host tensor, for data built on the host and read by ops many times
  // (weights, plans, tables). Where the device reads host memory (the CPU) it is the same storage.
  virtual absl::StatusOr<core::Tensor> Mirror(const core::Tensor& host) = 0;

  // Copies ordered on the device's stream; host memory should come from AllocateStaging.
  virtual void CopyToDevice(const void* host, void* device, size_t bytes) = 0;
  virtual void CopyToHost(const void* device, void* host, size_t bytes) = 0;
  // Waits until every op issued so far has finished.
  virtual void Synchronize() = 0;
  // The first error of an operation that returns none (ops and copies are void: on a GPU a failed
  // launch or copy is kept here, and the stream is unusable after it), or OK. Always OK on the CPU.
  virtual absl::Status status() const { return absl::OkStatus(); }
  // Free and total memory (the CPU: the host's available memory, core::AvailableMemoryBytes).
  virtual absl::StatusOr<DeviceMemory> Memory() const;

  // Called on the thread that will issue this device's work (the engine thread) before its
  // first op. The CPU device sets that thread's OpenMP team size to threads(), so that oneDNN's
  // parallel regions (sized by the thread's OpenMP setting) use the same team as iris's kernels.
  virtual void AttachThread() {}
  // A share of this device's compute, sized by it (the CPU: its team's threads), for ShareCompute
  // on this device and on a second device object beside it. UNIMPLEMENTED where a device has no
  // such split (a GPU: its second stream runs beside the first).
  virtual absl::StatusOr<std::shared_ptr<ComputeShare>> NewComputeShare() const {
    return absl::UnimplementedError("this device does not split its compute with another");
  }
  // From here on this device's compute follows `share` as `side` (kernels/compute_share.h: the
  // CPU's cores, split between the decoder's and the encoder's device objects while both have
  // work). Before the device is used. UNIMPLEMENTED where a device has no such split (a GPU:
  // its second stream runs beside the first); INVALID_ARGUMENT when the share's size is not the
  // device's (the CPU: its team's size).
  virtual absl::Status ShareCompute(std::shared_ptr<ComputeShare> share, ComputeShare::Side side) {
    return absl::UnimplementedError("this device does not split its compute with another");
  }
  // Called by the thread that issues this device's work, between ops: under a ComputeShare, takes
  // the part of the compute it may use now. Nothing elsewhere.
  virtual void Rebalance() {}

  // The row counts at which an engine's warm-up runs a forward, ascending, the last max_rows:
  // where a first call does one-off work (buffers grow to their largest at max_rows; a GPU that
  // tunes its matmuls times each row bucket once, CudaDevice::SetMatmulTuning), so that it
  // happens at start and not in a request.
  virtual std::vector<int64_t> WarmUpRowCounts(int64_t max_rows) const { return {max_rows}; }

  // Whether BeginCapture/EndCapture record graphs here (a CUDA GPU), so that callers can choose
  // before issuing anything.
  virtual bool records_graphs() const { return false; }
  // Graph capture: ops issued between BeginCapture and EndCapture are recorded, not run, and
  // the returned graph replays them. UNIMPLEMENTED where the device has no graphs (the CPU).
  virtual absl::Status BeginCapture() { return absl::UnimplementedError("this device has no graph capture"); }
  virtual absl::StatusOr<std::unique_ptr<DeviceGraph>> EndCapture() {
    return absl::UnimplementedError("this device has no graph capture");
  }
};

// t itself when it is host memory (the CPU's tensors); else a host copy of it (waits for the copy).
// Where device results leave the device: the encoder's embeddings, the decoder's logits.
absl::StatusOr<core::Tensor> HostCopy(Device& device, const core::Tensor& t);

// An op called on a device it has no implementation for: a programming error, never input (model
// loading refuses such a device first: Linear::Create returns UNIMPLEMENTED). Prints and aborts.
[[noreturn]] void NoKernelFor(const Device& device, const char* op);

struct DeviceOptions {
  std::string name = "cpu";  // "cpu", or in a CUDA build "cuda" / "cuda:N"
  int threads = 0;           // CPU: the thread team's size; 0 = OMP_NUM_THREADS or every core
  // CPU: the highest instruction set iris's own kernels may use ("avx2", "avx512",
  // "avx512_bf16"; empty = what the processor has, capped by the IRIS_CPU_ISA variable).
  std::string cpu_isa;
  // CUDA: the varlen attention of the bf16 compute mode: "flash" (iris's tensor-core kernel, the
  // default; empty means it) or "cudnn" (cuDNN's SDPA operation, kernels/cuda/cudnn_sdpa.h).
  // The CPU has its own kernel only.
  std::string attention;
  // CUDA: how a step's prefill rows attend over the paged KV cache in the bf16 mode over bf16
  // pages: "tensor-cores" (kernels/cuda/paged_flash_mma.cuh, the default; empty means it) or
  // "cuda-cores" (a block per row and head, the decode rows' kernel). The CPU has its own kernel.
  std::string prefill_attention;
  // CUDA: how decode rows attend in the bf16 mode over bf16 pages: "cuda-cores" (a block per row
  // and q head, the default; empty means it), "tensor-cores" (for a large batch, a block per row
  // and kv head, its q heads one tile's rows) or "tensor-cores-every-batch"
  // (CudaDevice::SetDecodeAttention; not yet timed).
  std::string decode_attention;
  // CUDA: a step of decode rows only rotates q and k and writes the KV cache in a launch of its
  // own ("separate", the default; empty means it), inside its paged attention ("fused": one
  // launch fewer a layer; CudaDevice::SetFusedDecodeRotary) or as the qkv GEMV's epilogue ("gemv":
  // one launch fewer where the step's rows run a CUDA-core GEMV; CudaDevice::SetQkvGemvRotary).
  // The CPU runs them in turn, as "separate" does.
  std::string decode_rotary;
  // CUDA: the flash attention runs its pipelined kernel on the encoder's bf16 q/k/v rows
  // (CudaDevice::SetFlashPipeline; on by default, faster on an H200). The CPU's kernel has no
  // pipeline: there the setting has no effect.
  bool flash_pipeline = true;
  // CUDA: cuBLASLt matmuls of encoder- and prefill-sized rows run the fastest of the heuristic's
  // candidates, timed once per shape and row bucket (CudaDevice::SetMatmulTuning; off by default
  // until timed on a GPU).
  bool matmul_tuning = false;
  // CUDA, compute capability 9.0: which bf16 matmuls run iris's own Hopper GEMM instead of
  // cuBLASLt (CudaDevice::SetHopperGemm): "off" (the default; empty means it), "swiglu" (the gated
  // MLP's gate_up with the SiLU·mul as its epilogue) or "all" (that and every other bf16 matmul
  // without a GELU). Not yet run on a GPU. The CPU has oneDNN's matmuls only.
  std::string hopper_gemm;
};

// INVALID_ARGUMENT for an unknown name, UNIMPLEMENTED for a backend this build lacks,
// FAILED_PRECONDITION for a GPU that is not there or not usable (the message says why).
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options);

// The process's default CPU device (threads and ISA from the environment), for tools and tests
// that run ops outside an engine. Created on first use, never destroyed.
Device& DefaultCpuDevice();

}  // namespace iris::kernels
