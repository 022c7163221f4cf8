// Flash-style varlen attention on AVX-512 (the micro-kernels are flash_tile.h's).
//
// Work is split into units of (sequence, head, block of 64 queries), run in parallel. A unit walks
// the sequence's keys in blocks of 64 with an online softmax, 4 query rows per micro-tile.
//
// Sequences of at most 64 tokens (the vision tower's windows) pack their keys inside the unit;
// longer sequences, whose key blocks are shared by many query blocks, are packed once up front.
// While a block computes, the rows the next one reads are prefetched into L2.
#include "kernels/cpu/cpu_ops.h"

#include "kernels/cpu/flash_tile.h"  // first: it sets up the intrinsics headers

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/isa_region.h"

IRIS_AVX512_BEGIN
namespace iris::kernels::cpu::avx512 {
namespace {

using namespace flash;

constexpr int kBlock = kKeys;  // keys per key block, queries per unit

struct Unit {
  int32_t seq;
  int32_t head;
  int32_t q0;  // first query of the block, relative to the sequence start
  int32_t q_end;  // one past its last query (relative): the block, or the q_end clip
};

// Where a unit's data lives.
struct UnitGeom {
  int seq, g, q0, n, nq, nkb;
  bool prepacked;  // keys packed up front (long sequence) rather than inside the unit
  const float* qh;
  const float* kh;
  const float* vh;
  float* oh;
};

// Rows to prefetch into L2, issued in slices spread over the tiles of a key block.
struct Prefetch {
  const float* base[3];
  int64_t stride[3];
  int rows[3];
  int count = 0;
  int total = 0;
  void Add(const float* b, int64_t st, int n) {
    if (n <= 0) return;
    base[count] = b;
    stride[count] = st;
    rows[count] = n;
    ++count;
    total += n;
  }
  // Slice `i` of `n`: rows [total*i/n, total*(i+1)/n) of the concatenated row lists.
  void Issue(int i, int n, int head_dim) const {
    if (total == 0) return;
    int begin = static_cast<int>(static_cast<int64_t>(total) * i / n);
    int end = static_cast<int>(static_cast<int64_t>(total) * (i + 1) / n);
    for (int l = 0; l < count && begin < end; ++l) {
      const int lb = begin, le = std::min(end, rows[l]);
      for (int r = lb; r < le; ++r) {
        const char* row = reinterpret_cast<const char*>(base[l] + r * stride[l]);
        for (int off = 0; off < head_dim * 4; off += 64) PrefetchL2(row + off);
        PrefetchL2(row + head_dim * 4 - 1);
      }
      begin = std::max(0, begin - rows[l]);
      end -= rows[l];
    }
  }
};

template <bool kBf16>
void Run(CpuDevice& dev, const AttentionArgs& a) {
  const int num_seqs = static_cast<int>(a.cu_seqlens.size()) - 1;
  const int kv_heads = a.num_kv_heads > 0 ? a.num_kv_heads : a.num_heads;
  const int group = a.num_heads / kv_heads;
  const int hd = a.head_dim;
  const int32_t* cu = a.cu_seqlens.data();

  const Shape sh = MakeShape(hd, a.scale, a.causal);

  // Units, and the key blocks of the long sequences (packed up front, shared by query blocks).
  std::vector<Unit> units;
  std::vector<int64_t> block_base(num_seqs, -1);  // first packed block of sequence s, or -1
  int64_t total_blocks = 0;
  const int64_t q_end = a.q_end < 0 ? cu[num_seqs] : a.q_end;
  for (int s = 0; s < num_seqs; ++s) {
    const int n = cu[s + 1] - cu[s];
    // The queries of this sequence that are asked for (all, unless clipped to [q_begin, q_end)).
    const int lo = static_cast<int>(std::clamp<int64_t>(a.q_begin - cu[s], 0, n));
    const int hi = static_cast<int>(std::clamp<int64_t>(q_end - cu[s], 0, n));
    if (hi <= lo) continue;
    if (n > kBlock) {
      block_base[s] = total_blocks;
      total_blocks += (n + kBlock - 1) / kBlock;
    }
    for (int h = 0; h < a.num_heads; ++h)
      for (int q0 = lo; q0 < hi; q0 += kBlock) units.push_back({s, h, q0, std::min(q0 + kBlock, hi)});
  }
  if (units.empty()) return;

  const BlockLayout layout = MakeBlockLayout<kBf16>(sh);
  const size_t block_bytes = layout.bytes;
  auto pack_block = [&](const float* k0, const float* v0, int kn, char* dst) {
    PackBlock<kBf16>(sh, layout, StridedRows{k0, a.k.row_stride}, StridedRows{v0, a.v.row_stride}, kn, dst);
  };

  char* packed = nullptr;
  if (total_blocks > 0) {
    packed = static_cast<char*>(
        dev.Scratch(CpuDevice::kSlotPackedKeys, 0, static_cast<size_t>(kv_heads) * total_blocks * block_bytes));
    std::vector<std::pair<int32_t, int32_t>> blocks;  // (seq, block)
    blocks.reserve(total_blocks);
    for (int s = 0; s < num_seqs; ++s) {
      if (block_base[s] < 0) continue;
      const int n = cu[s + 1] - cu[s];
      for (int b = 0; b * kBlock < n; ++b) blocks.push_back({s, b});
    }
    const int64_t jobs = static_cast<int64_t>(kv_heads) * total_blocks;
#pragma omp parallel for num_threads(dev.threads()) schedule(static)
    for (int64_t job = 0; job < jobs; ++job) {
      const int g = static_cast<int>(job / total_blocks);
      const auto [s, b] = blocks[job % total_blocks];
      const int n = cu[s + 1] - cu[s];
      const int kn = std::min(kBlock, n - b * kBlock);
      const int64_t row0 = cu[s] + static_cast<int64_t>(b) * kBlock;
      const float* k0 = a.k.data + row0 * a.k.row_stride + static_cast<int64_t>(g) * a.k.head_stride;
      const float* v0 = a.v.data + row0 * a.v.row_stride + static_cast<int64_t>(g) * a.v.head_stride;
      pack_block(k0, v0, kn, packed + (g * total_blocks + block_base[s] + b) * block_bytes);
    }
  }

  const int64_t num_units = static_cast<int64_t>(units.size());
  auto geom = [&](const Unit& unit) {
    UnitGeom ug;
    ug.seq = unit.seq;
    ug.g = unit.head / group;
    ug.q0 = unit.q0;
    const int64_t t0 = cu[unit.seq];
    ug.n = cu[unit.seq + 1] - cu[unit.seq];
    ug.nq = unit.q_end - unit.q0;
    // Keys this block needs: all, or up to its last query when causal.
    const int k_end = a.causal ? unit.q0 + ug.nq : ug.n;
    ug.nkb = (k_end + kBlock - 1) / kBlock;
    ug.prepacked = block_base[unit.seq] >= 0;
    ug.qh = a.q.data + (t0 + unit.q0) * a.q.row_stride + static_cast<int64_t>(unit.head) * a.q.head_stride;
    ug.kh = a.k.data + t0 * a.k.row_stride + static_cast<int64_t>(ug.g) * a.k.head_stride;
    ug.vh = a.v.data + t0 * a.v.row_stride + static_cast<int64_t>(ug.g) * a.v.head_stride;
    ug.oh = a.out + (t0 + unit.q0) * a.out_row_stride + static_cast<int64_t>(unit.head) * hd;
    return ug;
  };
  const int qb_stride = sh.hp * 2;  // bf16 q row: head_dim rounded up to even

#pragma omp parallel num_threads(dev.threads())
  {
    const size_t need = block_bytes + 64 + static_cast<size_t>(kBlock) * hd * 4 + 2 * (kBlock * 4 + 64) +
                        kRows * kBlock * 4 + 64 + kRows * kBlock * 2 + 64 +
                        static_cast<size_t>(kBlock) * qb_stride * 2 + 64;
    Carver carve{static_cast<char*>(dev.Scratch(CpuDevice::kSlotTile, omp_get_thread_num(), need))};
    char* block_local = carve.Take<char>(block_bytes);
    TileState st;
    st.o = carve.Take<float>(static_cast<size_t>(kBlock) * hd);
    st.m = carve.Take<float>(kBlock);
    st.l = carve.Take<float>(kBlock);
    st.p = carve.Take<float>(kRows * kBlock);
    st.pb = carve.Take<uint16_t>(kRows * kBlock);
    uint16_t* qb = carve.Take<uint16_t>(static_cast<size_t>(kBlock) * qb_stride);
    NoPrefetch no_prefetch;  // this kernel prefetches a slice before each tile instead

    // Chunks of consecutive units per thread, so that the unit after this one is usually this
    // thread's own and its rows can be prefetched while this one computes.
    const int64_t chunk = std::clamp<int64_t>(num_units / (8 * omp_get_num_threads()), 1, 8);
#pragma omp for schedule(dynamic, chunk)
    for (int64_t u = 0; u < num_units; ++u) {
      const UnitGeom ug = geom(units[u]);
      for (int r = 0; r < kBlock; ++r) {
        st.m[r] = kNegInf;
        st.l[r] = 0.f;
      }
      TileInputs<StridedRows> in{};
      if constexpr (kBf16) {
        RoundRowsToBf16(ug.nq, [&](int i) { return ug.qh + i * a.q.row_stride; }, hd, qb_stride, qb);
      }
      for (int kb = 0; kb < ug.nkb; ++kb) {
        const int kb0 = kb * kBlock;
        const int kn = std::min(kBlock, ug.n - kb0);
        const char* blk;
        if (!ug.prepacked) {
          pack_block(ug.kh, ug.vh, kn, block_local);
          blk = block_local;
        } else {
          blk = packed + (ug.g * total_blocks + block_base[ug.seq] + kb) * block_bytes;
        }
        in.kt = reinterpret_cast<const float*>(blk);
        in.ktb = reinterpret_cast<const uint32_t*>(blk);
        in.vb = reinterpret_cast<const uint16_t*>(blk + layout.vb_offset);
        in.v = StridedRows{ug.vh + static_cast<int64_t>(kb0) * a.v.row_stride, a.v.row_stride};
        const bool first = kb == 0, last = kb == ug.nkb - 1;

        // What to prefetch (into L2) while this block computes: the next key block's V rows
        // (f32: read in place), or the next unit's Q, K and V rows. The loads they save are
        // strided rows (a page apart in a qkv buffer) that the hardware prefetchers miss.
        Prefetch next;
        if (!last) {
          if (!kBf16) next.Add(in.v[kBlock], a.v.row_stride, std::min(kBlock, ug.n - kb0 - kBlock));
        } else if (u + 1 < num_units) {
          const UnitGeom nu = geom(units[u + 1]);
          next.Add(nu.qh, a.q.row_stride, nu.nq);
          if (!nu.prepacked) next.Add(nu.kh, a.k.row_stride, std::min(kBlock, nu.n));
          if (!nu.prepacked || !kBf16) next.Add(nu.vh, a.v.row_stride, std::min(kBlock, nu.n));
        }
        const int tiles = (ug.nq + kRows - 1) / kRows;

        for (int ti = 0; ti < tiles; ++ti) {
          const int t = ti * kRows;
          next.Issue(ti, tiles, hd);
          int64_t qpos[kRows];
          float* out_rows[kRows];
          for (int r = 0; r < kRows; ++r) {
            const int i = std::min(t + r, ug.nq - 1);  // rows past the block repeat its last row
            in.q_rows[r] = ug.qh + i * a.q.row_stride;
            in.qb_rows[r] = qb + static_cast<size_t>(i) * qb_stride;
            qpos[r] = ug.q0 + i;
            out_rows[r] = ug.oh + i * a.out_row_stride;
          }
          const int rows_valid = std::min(kRows, ug.nq - t);
          TileForKeys<kBf16>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t, no_prefetch);
        }
      }
    }
  }
}

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
  if (a.bf16 && dev.native_bf16()) {
    Run<true>(dev, a);
  } else {
    Run<false>(dev, a);
  }
}

}  // namespace iris::kernels::cpu::avx512
IRIS_AVX512_END
