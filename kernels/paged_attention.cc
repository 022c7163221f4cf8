// The dispatch point of these ops: the one place that picks each one's implementation for a device
// (on the CPU, by instruction-set tier: AVX-512 kernels from kAvx512 on, the portable ones below;
// on a GPU, iris's CUDA kernels through kernels/cuda/cuda_kernels.h, launched on the device's stream).
#include "kernels/paged_attention.h"

#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/paged_sequences.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_linear.h"
#include "kernels/cuda/paged_prefill_args.h"
#endif

namespace iris::kernels {
#ifdef IRIS_HAVE_CUDA
namespace {

// Whether a step of `rows` rows is decode rows only, all of them (md's host summaries): the steps
// whose rotary and KV write a GPU may fold into another launch.
bool AllDecodeRows(const PagedMetadata& md, int64_t rows) {
  return md.num_seqs > 0 && md.max_query_len == 1 && md.row_begin == 0 && md.row_end == rows;
}

// Whether a step's `rows` decode rows go to the packed tensor-core kernel: where the device says
// (CudaDevice::decode_attention), in the bf16 mode over bf16 pages it takes.
bool DecodeRowsOnTensorCores(const cuda::CudaDevice& gpu, const PagedAttentionArgs& args, int64_t rows) {
  const PagedKvLayer& L = args.layer;
  return gpu.DecodeOnTensorCores(rows, args.num_heads) && args.bf16 && L.dtype == core::DType::kBF16 &&
         cuda::PagedDecodeMmaTakes(args.num_heads, L.num_kv_heads, L.head_dim, L.k, L.v);
}

// The step's decode rows [md.row_begin, decode_end) on the tensor cores, a block per (row, kv
// head), with the step's rotary and KV write where `rotary` is given (every row a decode row).
void DecodeRowsPacked(cuda::CudaDevice& gpu, const PagedAttentionArgs& args, int64_t decode_end,
                      const cuda::PagedDecodeRotary* rotary) {
  const PagedKvLayer& L = args.layer;
  const int64_t rows = decode_end - args.metadata.row_begin;
  cuda::PagedPrefillParams pp = cuda::PagedPrefillParamsOf(args);
  pp.decode_row_end = decode_end;
  if (rotary != nullptr) pp.rotary = *rotary;
  // Few rows: each (row, kv head)'s keys split over blocks to fill the GPU, their partials in the
  // activation scratch (nothing else uses it during the launch).
  pp.splits = cuda::PagedDecodeMmaSplits(rows, L.num_kv_heads, gpu.sm_count());
  if (pp.splits > 1) {
    pp.partials = static_cast<float*>(
        gpu.ActivationScratch(cuda::PagedAttentionPartialBytes(rows, args.num_heads, L.head_dim, pp.splits)));
    if (pp.partials == nullptr) return;  // the device keeps the error
    pp.split_counters = gpu.paged_split_counters();
  }
  for (int i = 0, n = gpu.LaunchesOf(cuda::CudaDevice::RepeatedOp::kPagedAttention); i < n; ++i) {
    gpu.Check(cuda::LaunchPagedDecodeMma(gpu.stream(), pp),
              rotary != nullptr ? "PagedAttention: decode rows and their rotary on the tensor cores"
                                : "PagedAttention: decode rows on the tensor cores");
  }
}

// The step's decode rows [md.row_begin, decode_end) on the CUDA cores, a block per (row, q head),
// with the step's rotary and KV write where `rotary` is given (every row a decode row).
void DecodeRowsOnCudaCores(cuda::CudaDevice& gpu, const PagedAttentionArgs& args, int64_t decode_end,
                           const cuda::PagedDecodeRotary* rotary) {
  const PagedKvLayer& L = args.layer;
  const PagedMetadata& md = args.metadata;
  const int64_t rows = decode_end - md.row_begin;
  // A small step (a few decodes) splits each row's keys over several blocks to fill the GPU; their
  // partials live in the activation scratch, which nothing else uses during the launch, and the
  // device's split counters (sm_count ints: enough, as splits > 1 only where rows x heads <=
  // sm_count / 2) say which block merges them.
  const int splits =
      cuda::PagedAttentionSplits(rows, args.num_heads, gpu.sm_count(), gpu.paged_attention_max_splits());
  float* partials = nullptr;
  if (splits > 1) {
    if (rows * args.num_heads > gpu.sm_count()) {
      return gpu.Report(absl::InternalError("PagedAttention: more (row, head) splits than split counters"));
    }
    partials = static_cast<float*>(
        gpu.ActivationScratch(cuda::PagedAttentionPartialBytes(rows, args.num_heads, L.head_dim, splits)));
    if (partials == nullptr) return;  // the device keeps the error
  }
  for (int i = 0, n = gpu.LaunchesOf(cuda::CudaDevice::RepeatedOp::kPagedAttention); i < n; ++i) {
    gpu.Check(cuda::LaunchPagedAttention(gpu.stream(), args.q, args.q_row_stride, args.out, args.out_row_stride,
                                         args.num_heads, args.scale, L.k, L.v, L.dtype == core::DType::kBF16,
                                         L.block_size, L.num_kv_heads, L.head_dim, md.query_start.data(),
                                         md.context_lens.data(), md.block_tables.data(), md.max_blocks_per_seq,
                                         md.num_seqs, md.row_begin, decode_end, splits, partials,
                                         gpu.paged_split_counters(), gpu.early_start(), rotary,
                                         gpu.paged_attention_lean() && rows * args.num_heads * splits > gpu.sm_count()),
              rotary != nullptr ? "PagedAttention with the decode rotary" : "PagedAttention");
  }
}

}  // namespace
#endif


void WritePagedKv(Device& device, const PagedKvLayer& layer, const float* k, int64_t k_row_stride,
                  const float* v, int64_t v_row_stride, std::span<const int64_t> slot_mapping) {
  switch (device.kind()) {
    case DeviceKind::kCpu:
      // Row copies: one implementation for every tier.
      return cpu::WritePagedKv(cpu::AsCpu(device), layer, k, k_row_stride, v, v_row_stride, slot_mapping);
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      // The layer is checked as on the CPU; the slots are device memory, and the kernel skips one
      // outside the pool where the CPU stops (cuda_kernels.h).
      if (slot_mapping.empty()) return;
      cpu::CheckWritableKvLayer(layer);
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      return gpu.Check(cuda::LaunchWritePagedKv(gpu.stream(), k, k_row_stride, v, v_row_stride, slot_mapping.data(),
                                                static_cast<int64_t>(slot_mapping.size()),
                                                int64_t{layer.num_kv_heads} * layer.head_dim,
                                                layer.num_blocks * layer.block_size, layer.k, layer.v,
                                                layer.dtype == core::DType::kBF16),
                       "WritePagedKv");
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "WritePagedKv");
}

void RotaryQKWritePagedKv(Device& device, HeadsView q, HeadsView k, int64_t rows, int head_dim, const float* cos,
                          const float* sin, const PagedKvLayer& layer, const float* v, int64_t v_row_stride,
                          std::span<const int64_t> slot_mapping) {
#ifdef IRIS_HAVE_CUDA
  if (device.kind() == DeviceKind::kCuda && k.num_heads == layer.num_kv_heads && head_dim == layer.head_dim &&
      static_cast<int64_t>(slot_mapping.size()) == rows && rows > 0) {
    cpu::CheckWritableKvLayer(layer);
    cuda::CudaDevice& gpu = cuda::AsCuda(device);
    for (int i = 0, n = gpu.LaunchesOf(cuda::CudaDevice::RepeatedOp::kDecodeRotary); i < n; ++i) {
      gpu.Check(cuda::LaunchRotaryQKWritePagedKv(gpu.stream(), q.data, q.row_stride, q.num_heads, k.data, k.row_stride,
                                                 k.num_heads, rows, head_dim, cos, sin, v, v_row_stride,
                                                 slot_mapping.data(), layer.num_blocks * layer.block_size, layer.k,
                                                 layer.v, layer.dtype == core::DType::kBF16, gpu.early_start()),
                "RotaryQKWritePagedKv");
    }
    return;
  }
#endif
  RotaryQK(device, q, k, rows, head_dim, cos, sin);
  WritePagedKv(device, layer, k.data, k.row_stride, v, v_row_stride, slot_mapping);
}

void PagedAttention(Device& device, const PagedAttentionArgs& args) {
  switch (device.kind()) {
    case DeviceKind::kCpu: {
      cpu::CpuDevice& cpu = cpu::AsCpu(device);
      if (cpu.isa() >= cpu::CpuIsa::kAvx512) return cpu::avx512::PagedAttention(cpu, args);
      return cpu::portable::PagedAttention(cpu, args);
    }
    case DeviceKind::kCuda: {
#ifdef IRIS_HAVE_CUDA
      // The arguments are checked as on the CPU, except the metadata's values (device memory).
      // For decode rows, args.bf16 (bf16-rounded products on the CPU) is served by the
      // f32-product kernel here: at least as exact, and the pages are read as they are, f32 or
      // bf16, either way.
      const PagedKvLayer& L = args.layer;
      const PagedMetadata& md = args.metadata;
      if (md.num_seqs <= 0) return;
      cpu::CheckPagedAttentionArgs(args);
      cuda::CudaDevice& gpu = cuda::AsCuda(device);
      // Prefill chunks (the sequences from md.prefill_seq_begin on) on the tensor cores where the
      // device is set to it, the mode is bf16 and the pages are bf16 (its numerics are the bf16
      // mode's); the decode rows before them keep their kernel (first: it may start early, behind
      // the kernel ahead).
      const bool prefill_mma = gpu.paged_prefill_mma() && args.bf16 && L.dtype == core::DType::kBF16 &&
                               md.max_query_len > 1 && md.prefill_seq_begin < md.num_seqs &&
                               cuda::PagedPrefillMmaTakes(L.head_dim, L.k, L.v);
      const int64_t decode_end =
          prefill_mma ? std::clamp(md.prefill_row_begin, md.row_begin, md.row_end) : md.row_end;
      // The packed tensor-core kernel reads each decode row's keys once per kv head, where the
      // device says (CudaDevice::decode_attention; bf16 mode and pages, as the prefill kernel).
      const int64_t decode_rows = decode_end - md.row_begin;
      if (decode_rows > 0 && DecodeRowsOnTensorCores(gpu, args, decode_rows)) {
        DecodeRowsPacked(gpu, args, decode_end, nullptr);
      } else if (decode_rows > 0) {
        DecodeRowsOnCudaCores(gpu, args, decode_end, nullptr);
      }
      if (prefill_mma) {
        gpu.Check(cuda::LaunchPagedPrefillMma(gpu.stream(), cuda::PagedPrefillParamsOf(args)),
                  "PagedAttention: prefill rows");
      }
      return;
#else
      break;
#endif
    }
  }
  NoKernelFor(device, "PagedAttention");
}

void RotaryPagedAttention(Device& device, const PagedAttentionArgs& args, HeadsView q, HeadsView k, int head_dim,
                          const float* cos, const float* sin, const float* v, int64_t v_row_stride,
                          std::span<const int64_t> slot_mapping) {
  const int64_t rows = static_cast<int64_t>(slot_mapping.size());
#ifdef IRIS_HAVE_CUDA
  const PagedKvLayer& L = args.layer;
  const PagedMetadata& md = args.metadata;
  // Where the rows go (the packed tensor-core kernel takes the rotary with key slices only: a kv
  // head's q heads fit one warp's rows).
  const bool packed = device.kind() == DeviceKind::kCuda && DecodeRowsOnTensorCores(cuda::AsCuda(device), args, rows);
  if (device.kind() == DeviceKind::kCuda && cuda::AsCuda(device).fused_decode_rotary() && AllDecodeRows(md, rows) &&
      q.data == args.q && q.row_stride == args.q_row_stride && q.num_heads == args.num_heads && q.bf16 == nullptr &&
      k.bf16 == nullptr &&
      k.num_heads == L.num_kv_heads && head_dim == L.head_dim && head_dim % 2 == 0 &&
      (!packed || cuda::PagedDecodeMmaKeySlices(args.num_heads, L.num_kv_heads) > 1)) {
    cpu::CheckPagedAttentionArgs(args);
    cpu::CheckWritableKvLayer(L);
    cuda::PagedDecodeRotary rotary;
    rotary.k = k.data;
    rotary.k_stride = k.row_stride;
    rotary.v = v;
    rotary.v_stride = v_row_stride;
    rotary.cos = cos;
    rotary.sin = sin;
    rotary.slots = slot_mapping.data();
    rotary.num_slots = L.num_blocks * L.block_size;
    rotary.k_pool = L.k;
    rotary.v_pool = L.v;
    if (packed) return DecodeRowsPacked(cuda::AsCuda(device), args, md.row_end, &rotary);
    return DecodeRowsOnCudaCores(cuda::AsCuda(device), args, md.row_end, &rotary);
  }
#endif
  RotaryQKWritePagedKv(device, q, k, rows, head_dim, cos, sin, args.layer, v, v_row_stride, slot_mapping);
  PagedAttention(device, args);
}

bool ProjectQkvRotaryWriteKv(Device& device, const Linear& qkv, const LinearInput& in, int64_t rows, float* qkv_out,
                             int num_heads, const PagedKvLayer& layer, const PagedMetadata& md, const float* cos,
                             const float* sin, std::span<const int64_t> slot_mapping) {
#ifdef IRIS_HAVE_CUDA
  if (device.kind() == DeviceKind::kCuda && cuda::AsCuda(device).qkv_gemv_rotary() && rows > 0 &&
      AllDecodeRows(md, rows) && static_cast<int64_t>(slot_mapping.size()) == rows &&
      (layer.dtype == core::DType::kBF16 || layer.dtype == core::DType::kF32)) {
    cpu::CheckWritableKvLayer(layer);
    cuda::GemvRotaryKv rot;
    rot.q_heads = num_heads;
    rot.k_heads = layer.num_kv_heads;
    rot.head_dim = layer.head_dim;
    rot.cos = cos;
    rot.sin = sin;
    rot.slots = slot_mapping.data();
    rot.num_slots = layer.num_blocks * layer.block_size;
    rot.k_pool = layer.k;
    rot.v_pool = layer.v;
    rot.bf16_pool = layer.dtype == core::DType::kBF16;
    if (cuda::QkvGemvRotaryKv(cuda::AsCuda(device), qkv, in, rows, qkv_out, rot)) return true;
  }
#endif
  LinearForward(device, qkv, in, rows, qkv_out);
  return false;
}

void SetHostSummaries(std::span<const int32_t> query_start, std::span<const int32_t> context_lens,
                      PagedMetadata& md) {
  md.row_begin = query_start.front();
  md.row_end = query_start.back();
  md.max_query_len = 0;
  md.max_context_len = 0;
  md.prefill_seq_begin = md.num_seqs;
  md.prefill_row_begin = md.row_end;
  for (int s = md.num_seqs - 1; s >= 0; --s) {
    const int q_len = query_start[s + 1] - query_start[s];
    md.max_query_len = std::max(md.max_query_len, q_len);
    md.max_context_len = std::max<int64_t>(md.max_context_len, context_lens[s]);
    if (q_len > 1) {  // walking back: the last one set is the first prefill sequence
      md.prefill_seq_begin = s;
      md.prefill_row_begin = query_start[s];
    }
  }
}

void PagedMetadataBuilder::Add(std::span<const int32_t> block_table, int64_t context_len, int64_t q_begin,
                               int64_t q_len) {
  if (tables_.empty()) query_start_.assign(1, static_cast<int32_t>(q_begin));
  tables_.emplace_back(block_table.begin(), block_table.end());
  context_lens_.push_back(static_cast<int32_t>(context_len));
  query_start_.push_back(static_cast<int32_t>(query_start_.back() + q_len));
}

PagedMetadata PagedMetadataBuilder::Build() {
  PagedMetadata md;
  md.num_seqs = static_cast<int>(context_lens_.size());
  for (const auto& t : tables_) md.max_blocks_per_seq = std::max(md.max_blocks_per_seq, static_cast<int>(t.size()));
  block_tables_.assign(static_cast<size_t>(md.num_seqs) * md.max_blocks_per_seq, 0);
  for (int s = 0; s < md.num_seqs; ++s) {
    std::copy(tables_[s].begin(), tables_[s].end(), block_tables_.begin() + static_cast<size_t>(s) * md.max_blocks_per_seq);
  }
  SetHostSummaries(query_start_, context_lens_, md);
  md.query_start = query_start_;
  md.context_lens = context_lens_;
  md.block_tables = block_tables_;
  return md;
}

}  // namespace iris::kernels
