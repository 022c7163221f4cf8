// Paged attention for processors without AVX-512: each query row walks its keys through the block
// table in blocks of 64 with an online softmax, every q head of its kv group against the same
// gathered rows. Items of (sequence, kv head, query row) run in parallel. f32 arithmetic
// (PagedAttentionArgs::bf16 is ignored); bf16 pages are widened to f32 as they are read, so they
// cost half the bytes of f32 pages.
//
// Head dims that are a multiple of 8 (every decoder iris serves) take group_row.h's AVX2 kernel,
// all heads of a group (up to 8 at a time) in one pass over each key block; other head dims take
// flash_row.h's per-head loop.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/paged_sequences.h"
#include "kernels/cpu/portable/flash_row.h"
#include "kernels/cpu/portable/group_row.h"

namespace iris::kernels::cpu::portable {
namespace {

struct Item {
  int32_t seq;
  int32_t g;    // kv head
  int64_t row;  // query row, relative to the sequence's q_begin
};

template <typename T>
using GroupFn = void (*)(const float*, int, const T* const*, const T* const*, int, float, float*, group_row::State&);

template <typename T, int G>
GroupFn<T> PickWidth(int head_dim) {
  constexpr int kW = group_row::PreferredWidth(G);
  if (head_dim % (8 * kW) == 0) return &group_row::Attend<G, kW, T>;
  if constexpr (kW > 2) {
    if (head_dim % 16 == 0) return &group_row::Attend<G, 2, T>;
  }
  return &group_row::Attend<G, 1, T>;
}

// The grouped kernel for g heads (1..8) and this head dim (a multiple of 8).
template <typename T>
GroupFn<T> PickGroupFn(int g, int head_dim) {
  switch (g) {
    case 1: return PickWidth<T, 1>(head_dim);
    case 2: return PickWidth<T, 2>(head_dim);
    case 3: return PickWidth<T, 3>(head_dim);
    case 4: return PickWidth<T, 4>(head_dim);
    case 5: return PickWidth<T, 5>(head_dim);
    case 6: return PickWidth<T, 6>(head_dim);
    case 7: return PickWidth<T, 7>(head_dim);
    default: return PickWidth<T, 8>(head_dim);
  }
}

// T: the pools' element type (float, or uint16_t for bf16).
template <typename T>
void Run(CpuDevice& dev, const PagedAttentionArgs& a, const std::vector<PagedSequence>& seqs) {
  const PagedKvLayer& L = a.layer;
  const T* kpool = static_cast<const T*>(L.k);
  const T* vpool = static_cast<const T*>(L.v);
  const int group = seqs.empty() ? 1 : a.num_heads / L.num_kv_heads;
  const int hd = L.head_dim;
  const int bs = L.block_size;
  const int64_t row_floats = static_cast<int64_t>(L.num_kv_heads) * hd;
  std::vector<Item> items;
  for (size_t si = 0; si < seqs.size(); ++si) {
    for (int64_t r = 0; r < seqs[si].q_len; ++r)
      for (int g = 0; g < L.num_kv_heads; ++g) items.push_back({static_cast<int32_t>(si), g, r});
  }
  const int64_t num_items = static_cast<int64_t>(items.size());
  const bool grouped = hd % 8 == 0;
  const int num_chunks = (group + group_row::kMaxGroup - 1) / group_row::kMaxGroup;
  std::vector<GroupFn<T>> chunk_fn(num_chunks);
  for (int c = 0; c < num_chunks; ++c)
    chunk_fn[c] = PickGroupFn<T>(std::min(group_row::kMaxGroup, group - c * group_row::kMaxGroup), hd);

#pragma omp parallel num_threads(dev.threads()) if (num_items > 1)
  {
    // o, then scores (64 x 8 floats for the grouped kernel, 64 for the per-head one).
    const size_t floats = (static_cast<size_t>(group) * hd + 15) / 16 * 16 + kKeyBlock * group_row::kMaxGroup;
    const size_t bytes =
        floats * sizeof(float) + 2 * kKeyBlock * sizeof(const T*) + static_cast<size_t>(group) * sizeof(RowState);
    char* scratch = static_cast<char*>(dev.Scratch(CpuDevice::kSlotTile, omp_get_thread_num(), bytes));
    float* o = reinterpret_cast<float*>(scratch);
    float* s = o + (static_cast<size_t>(group) * hd + 15) / 16 * 16;  // 64-byte aligned
    const T** krows = reinterpret_cast<const T**>(scratch + floats * sizeof(float));
    const T** vrows = krows + kKeyBlock;
    RowState* states = reinterpret_cast<RowState*>(vrows + kKeyBlock);
    std::vector<group_row::State> chunk_states(num_chunks);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < num_items; ++it) {
      const Item& item = items[it];
      const PagedSequence& seq = seqs[item.seq];
      const int64_t keys = seq.context_len - seq.q_len + item.row + 1;  // causal: up to its own position
      const int64_t q_row = seq.q_begin + item.row;
      const int h0 = item.g * group;
      const float* q = a.q + q_row * a.q_row_stride + static_cast<int64_t>(h0) * hd;  // the group's heads
      float* out = a.out + q_row * a.out_row_stride + static_cast<int64_t>(h0) * hd;
      // The pool rows of keys [kb, kb + n) of this item's kv head into krows / vrows.
      const auto gather = [&](int64_t kb, int n) {
        for (int j = 0; j < n; ++j) {
          const int64_t t = kb + j;
          const int64_t slot = int64_t{seq.block_table[t / bs]} * bs + t % bs;
          krows[j] = kpool + slot * row_floats + static_cast<int64_t>(item.g) * hd;
          vrows[j] = vpool + slot * row_floats + static_cast<int64_t>(item.g) * hd;
        }
      };
      if (grouped) {  // chunk c: heads [8c, 8c + 8) of the group
        for (int c = 0; c < num_chunks; ++c) {
          const int h = c * group_row::kMaxGroup;
          group_row::Start(chunk_states[c], o + static_cast<size_t>(h) * hd, std::min(group_row::kMaxGroup, group - h),
                           hd);
        }
        for (int64_t kb = 0; kb < keys; kb += kKeyBlock) {
          const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, keys - kb));
          gather(kb, n);
          for (int c = 0; c < num_chunks; ++c) {
            const int64_t h = c * group_row::kMaxGroup;
            chunk_fn[c](q + h * hd, n, krows, vrows, hd, a.scale, s, chunk_states[c]);
          }
        }
        for (int c = 0; c < num_chunks; ++c) {
          const int h = c * group_row::kMaxGroup;
          group_row::Finish(chunk_states[c], std::min(group_row::kMaxGroup, group - h), hd, out + h * hd);
        }
      } else {
        for (int i = 0; i < group; ++i) StartRow(states[i], o + static_cast<size_t>(i) * hd, hd);
        for (int64_t kb = 0; kb < keys; kb += kKeyBlock) {
          const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, keys - kb));
          gather(kb, n);
          for (int i = 0; i < group; ++i) {
            AttendKeys(
                q + static_cast<int64_t>(i) * hd, n, [&](int j) { return krows[j]; }, [&](int j) { return vrows[j]; },
                hd, a.scale, s, states[i]);
          }
        }
        for (int i = 0; i < group; ++i) FinishRow(states[i], hd, out + static_cast<int64_t>(i) * hd);
      }
    }
  }
}

}  // namespace

void PagedAttention(CpuDevice& dev, const PagedAttentionArgs& a) {
  const std::vector<PagedSequence> seqs = CheckedPagedSequences(a);
  if (a.layer.dtype == core::DType::kBF16) return Run<uint16_t>(dev, a, seqs);
  Run<float>(dev, a, seqs);
}

}  // namespace iris::kernels::cpu::portable
