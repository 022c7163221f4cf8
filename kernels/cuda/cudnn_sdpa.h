// Varlen attention through cuDNN's native SDPA operation (the backend API's
// CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR: cuDNN 9.15 or later, for its sequence-length
// inputs), the alternative to iris's own tensor-core flash kernel that the device's attention
// option picks (DeviceOptions::attention "cudnn"; the encoder bench measures both in one run).
//
// The sequences are one packed ("ragged") batch: q, k, v and the output are [rows, heads,
// head_dim] bf16 tensors whose sequence s starts at a ragged element offset, with per-sequence
// lengths; cuDNN sees dims [num_seqs, heads, bucket, head_dim] where `bucket` is max_seqlen rounded
// up to a power of two (at least 64), so that one execution plan serves every step of that
// bucket and sequence count. Plans are built on first use (heuristics mode A, the first engine
// config that finalizes) and cached. Around the op, three of iris's kernels (sdpa_io_kernels.cuh):
// the lengths and offsets from cu_seqlens on the device, q/k/v gathered from their f32 rows into
// the packed bf16 tensors, and the bf16 output widened into the f32 output rows. Nothing is read
// back to the host, so a forward using it stays capturable in a CUDA graph.
//
// Taken for the bf16 compute mode, non-causal attention over every query row of a known row count
// (AttentionArgs::num_rows; the encoder's whole-sequence calls) and head dims up to 256; other
// calls go to the flash kernels.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/attention.h"

namespace iris::kernels::cuda {

class CudaDevice;

class CudnnSdpa {
 public:
  // Loads libcudnn.so.9 (once per process; it is not linked). FAILED_PRECONDITION naming the
  // cause when this build had no cuDNN headers, the library cannot be loaded, it is older than
  // 9.15, or its handle cannot be made on the device's GPU.
  static absl::StatusOr<std::unique_ptr<CudnnSdpa>> Create(CudaDevice& device);
  ~CudnnSdpa();

  // Whether Run takes these arguments (see above).
  static bool Takes(const AttentionArgs& args);
  // Enqueues the attention on the device's stream. A failure (no plan for the shape, a cuDNN
  // error) is kept as the device's error (CudaDevice::Report), as a failed launch is.
  void Run(const AttentionArgs& args);

  int64_t plans_built() const { return plans_built_; }
  // The power-of-two length bucket a max_seqlen falls in (at least 64).
  static int64_t LengthBucket(int64_t max_seqlen);

 private:
  struct Plan;
  struct Handle;
  // (sequences, length bucket, q heads, kv heads, head dim)
  using Key = std::tuple<int64_t, int64_t, int, int, int>;
  CudnnSdpa(CudaDevice& device, std::unique_ptr<Handle> handle);
  absl::StatusOr<Plan*> PlanFor(const Key& key);
  // Device memory for the packed tensors and metadata of `rows` rows and `seqs` sequences, and
  // the plan's workspace, grown (never shrunk) as calls need.
  absl::Status Reserve(int64_t buffer_bytes, int64_t workspace_bytes);

  CudaDevice& device_;
  std::unique_ptr<Handle> handle_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  int64_t plans_built_ = 0;
  core::Tensor buffer_;     // packed q, k, v, output (bf16) and the int32 metadata
  core::Tensor workspace_;  // the largest plan workspace so far
};

}  // namespace iris::kernels::cuda
