// Varlen attention for processors without AVX-512. Units of (sequence, head, block of 64 queries)
// run in parallel, as in the AVX-512 kernel; a unit walks its keys in blocks of 64, packs each
// block once (transposed) and folds it into every query row that sees it: six rows at a time in
// row_tile.h's AVX2 kernels where head_dim is a multiple of 8 (every model iris serves), one row at
// a time in flash_row.h's plain C++ otherwise. f32 only: AttentionArgs::bf16 is ignored.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/portable/flash_row.h"
#include "kernels/cpu/portable/row_tile.h"

namespace iris::kernels::cpu::portable {
namespace {

constexpr int kQueryBlock = 64;

struct Unit {
  int32_t seq;
  int32_t head;
  int32_t q0;  // first query of the block, relative to the sequence start
  int32_t q_end;  // one past its last query (relative): the block, or the q_end clip
};

}  // namespace

void VarlenAttention(CpuDevice& dev, const AttentionArgs& a) {
  const int num_seqs = static_cast<int>(a.cu_seqlens.size()) - 1;
  if (num_seqs <= 0 || a.num_heads <= 0 || a.head_dim <= 0) return;
  const int kv_heads = a.num_kv_heads > 0 ? a.num_kv_heads : a.num_heads;
  if (a.num_heads % kv_heads != 0) {
    std::fprintf(stderr, "iris VarlenAttention: num_heads %d is not a multiple of num_kv_heads %d\n", a.num_heads,
                 kv_heads);
    std::abort();
  }
  const int group = a.num_heads / kv_heads;
  const int hd = a.head_dim;
  const int32_t* cu = a.cu_seqlens.data();
  std::vector<Unit> units;
  const int64_t q_end = a.q_end < 0 ? cu[num_seqs] : a.q_end;
  for (int s = 0; s < num_seqs; ++s) {
    const int n = cu[s + 1] - cu[s];
    // The queries of this sequence that are asked for (all, unless clipped to [q_begin, q_end)).
    const int lo = static_cast<int>(std::clamp<int64_t>(a.q_begin - cu[s], 0, n));
    const int hi = static_cast<int>(std::clamp<int64_t>(q_end - cu[s], 0, n));
    for (int h = 0; h < a.num_heads; ++h)
      for (int q0 = lo; q0 < hi; q0 += kQueryBlock) units.push_back({s, h, q0, std::min(q0 + kQueryBlock, hi)});
  }
  const int64_t num_units = static_cast<int64_t>(units.size());
  const bool tiled = hd % 8 == 0;

#pragma omp parallel num_threads(dev.threads())
  {
    // Per thread: the unit's row outputs o[64][hd], the packed key block kt[hd][64], scores
    // s[6][64] (one row's 64 on the per-row path), and the output of a tile's unused rows.
    const size_t floats = (static_cast<size_t>(kQueryBlock) + kKeyBlock + 1) * hd + row_tile::kRows * kKeyBlock;
    float* o = static_cast<float*>(dev.Scratch(CpuDevice::kSlotTile, omp_get_thread_num(), floats * sizeof(float)));
    float* kt = o + static_cast<size_t>(kQueryBlock) * hd;
    float* s = kt + static_cast<size_t>(kKeyBlock) * hd;
    float* unused_o = s + row_tile::kRows * kKeyBlock;
    RowState st[kQueryBlock];
    RowState unused;  // the state of a tile's rows past the unit's end: never read
    StartRow(unused, unused_o, hd);
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < num_units; ++u) {
      const Unit& unit = units[u];
      const int64_t t0 = cu[unit.seq];
      const int n = cu[unit.seq + 1] - cu[unit.seq];
      const int nq = unit.q_end - unit.q0;
      const int g = unit.head / group;
      const float* qh = a.q.data + (t0 + unit.q0) * a.q.row_stride + static_cast<int64_t>(unit.head) * a.q.head_stride;
      const float* kh = a.k.data + t0 * a.k.row_stride + static_cast<int64_t>(g) * a.k.head_stride;
      const float* vh = a.v.data + t0 * a.v.row_stride + static_cast<int64_t>(g) * a.v.head_stride;
      for (int i = 0; i < nq; ++i) StartRow(st[i], o + static_cast<size_t>(i) * hd, hd);
      const int k_end = a.causal ? unit.q0 + nq : n;  // keys the block's last query sees
      for (int kb0 = 0; kb0 < k_end; kb0 += kKeyBlock) {
        const int kn = std::min(kKeyBlock, n - kb0);
        const float* k0 = kh + kb0 * a.k.row_stride;
        const float* v0 = vh + kb0 * a.v.row_stride;
        PackKeysT([&](int j) { return k0 + j * a.k.row_stride; }, kn, hd, kt);
        if (tiled) {
          for (int r0 = 0; r0 < nq; r0 += row_tile::kRows) {
            row_tile::Tile tile;
            for (int r = 0; r < row_tile::kRows; ++r) {
              const int i = r0 + r;
              if (i < nq) {
                tile.q[r] = qh + i * a.q.row_stride;
                tile.st[r] = &st[i];
                tile.keys[r] = a.causal ? std::min(kn, unit.q0 + i - kb0 + 1) : kn;
              } else {  // past the unit's rows: computed on row r0's query, kept nowhere
                tile.q[r] = qh + r0 * a.q.row_stride;
                tile.st[r] = &unused;
                tile.keys[r] = 0;
              }
            }
            row_tile::Attend(tile, kt, v0, a.v.row_stride, hd, a.scale, s);
          }
          continue;
        }
        for (int i = 0; i < nq; ++i) {
          const int keys = a.causal ? std::min(kn, unit.q0 + i - kb0 + 1) : kn;
          if (keys <= 0) continue;
          AttendBlock(
              qh + i * a.q.row_stride, kt, keys, [&](int j) { return v0 + j * a.v.row_stride; }, hd, a.scale, s,
              st[i]);
        }
      }
      for (int i = 0; i < nq; ++i) {
        FinishRow(st[i], hd, a.out + (t0 + unit.q0 + i) * a.out_row_stride + static_cast<int64_t>(unit.head) * hd);
      }
    }
  }
}

}  // namespace iris::kernels::cpu::portable
