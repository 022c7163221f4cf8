// A decode step's rotary and KV write handed to the paged attention (host and device code: a
// plain struct the launch passes by value).
#pragma once

#include <cstdint>

namespace iris::kernels::cuda {

// What RotaryQKWriteKvKernel would have done for a step of decode rows, for PagedAttentionKernel's
// kRotary to do instead (LaunchPagedAttention with one: its q is then the rows' q heads before
// rotary): each row's k heads (before rotary) and v heads, the rows' rotary tables, and the pool
// slot each row's key and value go to (kernels::kPadSlot, or any slot outside [0, num_slots):
// none). The pools are the launch's, writable.
struct PagedDecodeRotary {
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* cos = nullptr;  // [rows, head_dim / 2]
  const float* sin = nullptr;
  const int64_t* slots = nullptr;  // [rows]
  int64_t num_slots = 0;
  void* k_pool = nullptr;
  void* v_pool = nullptr;
};

}  // namespace iris::kernels::cuda
