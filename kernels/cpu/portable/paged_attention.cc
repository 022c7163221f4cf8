// Paged attention in plain C++ for processors without AVX-512: each query row walks its keys
// through the block table in blocks of 64 with an online softmax (flash_row.h), every q head of
// its kv group against the same gathered rows. Items of (sequence, kv head, query row) run in
// parallel. f32 arithmetic (PagedAttentionArgs::bf16 is ignored); bf16 pages are widened to f32
// as they are read, so they cost half the bytes of f32 pages.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/paged_sequences.h"
#include "kernels/cpu/portable/flash_row.h"

namespace iris::kernels::cpu::portable {
namespace {

struct Item {
  int32_t seq;
  int32_t g;    // kv head
  int64_t row;  // query row, relative to the sequence's q_begin
};

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

#pragma omp parallel num_threads(dev.threads()) if (num_items > 1)
  {
    const size_t floats = (static_cast<size_t>(group) * hd + kKeyBlock + 15) / 16 * 16;  // keeps what follows aligned
    const size_t bytes =
        floats * sizeof(float) + 2 * kKeyBlock * sizeof(const T*) + static_cast<size_t>(group) * sizeof(RowState);
    char* scratch = static_cast<char*>(dev.Scratch(CpuDevice::kSlotTile, omp_get_thread_num(), bytes));
    float* o = reinterpret_cast<float*>(scratch);
    float* s = o + static_cast<size_t>(group) * hd;
    const T** krows = reinterpret_cast<const T**>(scratch + floats * sizeof(float));
    const T** vrows = krows + kKeyBlock;
    RowState* states = reinterpret_cast<RowState*>(vrows + kKeyBlock);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < num_items; ++it) {
      const Item& item = items[it];
      const PagedSequence& seq = seqs[item.seq];
      const int64_t keys = seq.context_len - seq.q_len + item.row + 1;  // causal: up to its own position
      const int64_t q_row = seq.q_begin + item.row;
      const int h0 = item.g * group;
      for (int i = 0; i < group; ++i) StartRow(states[i], o + static_cast<size_t>(i) * hd, hd);
      for (int64_t kb = 0; kb < keys; kb += kKeyBlock) {
        const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, keys - kb));
        for (int j = 0; j < n; ++j) {
          const int64_t t = kb + j;
          const int64_t slot = int64_t{seq.block_table[t / bs]} * bs + t % bs;
          krows[j] = kpool + slot * row_floats + static_cast<int64_t>(item.g) * hd;
          vrows[j] = vpool + slot * row_floats + static_cast<int64_t>(item.g) * hd;
        }
        for (int i = 0; i < group; ++i) {
          const float* q = a.q + q_row * a.q_row_stride + static_cast<int64_t>(h0 + i) * hd;
          AttendKeys(
              q, n, [&](int j) { return krows[j]; }, [&](int j) { return vrows[j]; }, hd, a.scale, s, states[i]);
        }
      }
      for (int i = 0; i < group; ++i) {
        FinishRow(states[i], hd, a.out + q_row * a.out_row_stride + static_cast<int64_t>(h0 + i) * hd);
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
