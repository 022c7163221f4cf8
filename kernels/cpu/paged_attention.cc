// Paged attention on AVX-512: the flash-style kernel of attention.cc, reading keys and values
// through block tables instead of from packed rows.
//
// Work items are (sequence, kv head, tile of query rows). An item holds every q head of its kv
// group for its rows (decode: 1 row x group heads; prefill: up to 64 / group rows x group heads),
// so each K/V row is read once per group, not once per q head. An item walks its keys in chunks
// of 64 (gathered across pages through the block table, so the block size is free) with an
// online softmax, on flash_tile.h's micro-kernels (4 q vectors x 64 keys per micro-tile; f32 P·V
// reads V's rows in place from the pool). Sequences split into several row tiles (prefills) have
// their chunks packed once up front and shared by the tiles. While a chunk computes, the next
// chunk's K and V rows are prefetched (pages are scattered, and the hardware prefetchers did not
// keep up with the gather).
//
// Items are sorted by cost (query vectors x keys) and handed out dynamically: a batch of decodes
// and the tiles of one long prefill both spread over all threads. (A single decode spreads over
// its kv heads only: keys are not split between threads.)
//
// The bf16 option (as in attention.cc): both products on vdpbf16ps from bf16-rounded q, k, v and
// p; the softmax and all accumulation stay f32. K is packed as pairs of dims, V as pairs of keys.
//
// bf16 pools (PagedKvLayer::dtype) halve the bytes read: with the bf16 option their rows are
// packed as they are (no rounding: they hold bf16 already); without it (f32 products) K rows are
// widened to f32 as they are packed and V rows as P·V loads them.
//
// Speed on the development machine (AMD EPYC, AVX512-BF16, one thread, 16/2 heads x 128, block
// size 16; kernels_bench --filter=paged): decode over K+V in L3 runs at ~22 GB/s f32 (~26 bf16),
// which is about the FMA bound for 8 q heads per kv head (2 x 8 x 128 MACs per 1 KB of K+V); from
// DRAM (batch 32 x 1024, 64 MiB) 8-13 GB/s against a 29-38 GB/s streaming read, limited by the
// misses the prefetches can keep in flight. Prefill of 1000 tokens (8/2 heads) at ~72% of the f32
// matmul peak, within 5% of VarlenAttention on the same data.
#include "kernels/cpu/cpu_ops.h"

#include "kernels/cpu/flash_tile.h"  // first: it sets up the intrinsics headers

#include <omp.h>

#include <algorithm>
#include <span>
#include <vector>

#include "core/isa_region.h"
#include "kernels/cpu/paged_sequences.h"

IRIS_AVX512_BEGIN
namespace iris::kernels::cpu::avx512 {
namespace {

using namespace flash;

constexpr int kChunk = kKeys;    // keys per online-softmax step
constexpr int kTargetQ = 64;     // q vectors (rows x group heads) per work item
constexpr int kInLoopPrefetchTiles = 4;

// The next chunk's K and V rows, prefetched a few cache lines at a time from inside the compute
// loops of the current chunk (QkTile's d loop, PvChunk's key loop) when an item has few tiles, or
// a slice before each tile when it has many. Issued in one burst, a chunk's 1024 lines (64 keys x
// 2 x 512 B) were no faster than no prefetch at all in decode (8 GB/s from DRAM on one thread;
// spread out: 13 GB/s): the burst stalls like the loads it replaces instead of overlapping with
// the arithmetic.
struct Prefetcher {
  // Up to three lists of rows (pool rows of K, of V, or one packed block as a single row).
  struct Segment {
    const void* const* rows;
    int n;         // rows
    int lines;     // prefetches per row
    int last_off;  // byte offset of a row's last byte
  };
  Segment seg[3];
  int nseg = 0;
  int per_step = 0;  // prefetches per Step()
  int si = 0, row = 0, line = 0;

  template <typename T>
  void Add(const T* const* rows, int n, int row_bytes, bool aligned) {
    if (n <= 0) return;
    // Whole cache lines: one prefetch per line; else one more for the straddled line.
    seg[nseg++] = {reinterpret_cast<const void* const*>(rows), n,
                   aligned && row_bytes % 64 == 0 ? row_bytes / 64 : (row_bytes - 1) / 64 + 2, row_bytes - 1};
  }
  int64_t Lines() const {
    int64_t total = 0;
    for (int i = 0; i < nseg; ++i) total += static_cast<int64_t>(seg[i].n) * seg[i].lines;
    return total;
  }
  inline void Step() {
    for (int i = 0; i < per_step; ++i) {
      if (si >= nseg) return;
      const Segment& g = seg[si];
      PrefetchL2(reinterpret_cast<const char*>(g.rows[row]) + std::min(line * 64, g.last_off));
      if (++line == g.lines) {
        line = 0;
        if (++row == g.n) {
          row = 0;
          ++si;
        }
      }
    }
  }
  // Whatever the loops did not get to.
  void Finish() {
    per_step = 1 << 30;
    Step();
  }
};

struct Item {
  int32_t seq;
  int32_t g;      // kv head
  int32_t row0;   // first query row, relative to the sequence's q_begin
  int32_t nrows;
  int64_t cost;   // q vectors x keys
};

// The pool rows of keys [kb0, kb0 + kn) of kv head g of a sequence (T: the pools' element type).
template <typename T>
void GatherRows(const PagedKvLayer& L, const PagedSequence& s, int g, int64_t kb0, int kn, const T** krows,
                const T** vrows) {
  const int bs = L.block_size;
  const int64_t row_floats = static_cast<int64_t>(L.num_kv_heads) * L.head_dim;
  const int64_t head_off = static_cast<int64_t>(g) * L.head_dim;
  int j = 0;
  while (j < kn) {
    const int64_t t = kb0 + j;
    const int64_t blk = s.block_table[t / bs];
    const int off = static_cast<int>(t % bs);
    const int n = std::min(kn - j, bs - off);
    const int64_t base = (blk * bs + off) * row_floats + head_off;
    for (int i = 0; i < n; ++i) {
      krows[j + i] = static_cast<const T*>(L.k) + base + i * row_floats;
      vrows[j + i] = static_cast<const T*>(L.v) + base + i * row_floats;
    }
    j += n;
  }
}

// kBf16: the bf16 products; T: the pools' element type (float, or uint16_t for bf16 pages).
template <bool kBf16, typename T>
void Run(CpuDevice& dev, const PagedAttentionArgs& a, std::span<const PagedSequence> seqs, const std::vector<Item>& items,
         int group, int max_q) {
  const PagedKvLayer& L = a.layer;
  const int hd = L.head_dim;
  const Shape sh = MakeShape(hd, a.scale, /*causal=*/true);  // positions: the keys before a row, and itself
  const BlockLayout layout = MakeBlockLayout<kBf16>(sh);
  const int qb_stride = sh.hp * 2;  // bf16 q row: head_dim rounded up to even
  const int64_t num_items = static_cast<int64_t>(items.size());
  // Whole cache lines per row: one prefetch per line, else one more for the straddled line.
  const int row_bytes = hd * static_cast<int>(sizeof(T));
  const bool rows_aligned = row_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(L.k) % 64 == 0 &&
                            reinterpret_cast<uintptr_t>(L.v) % 64 == 0;
  // A micro-tile reads and writes the state of 4 q vectors even past the item's last one.
  const int max_q_state = (max_q + kRows - 1) / kRows * kRows;
  const size_t block_bytes = layout.bytes;

  // Sequences split into several row tiles (prefills) share their key chunks between the
  // tiles: those chunks are packed once up front, [seq][kv head][chunk], instead of per item.
  std::vector<int64_t> pack_base(seqs.size(), -1);
  int64_t total_packed = 0;
  {
    std::vector<int> tiles_of(seqs.size(), 0);
    for (const Item& item : items) tiles_of[item.seq] += item.g == 0;
    for (size_t si = 0; si < seqs.size(); ++si) {
      if (tiles_of[si] < 2) continue;
      pack_base[si] = total_packed;
      total_packed += L.num_kv_heads * ((seqs[si].context_len + kChunk - 1) / kChunk);
    }
  }
  char* packed = nullptr;
  if (total_packed > 0) {
    packed = static_cast<char*>(
        dev.Scratch(CpuDevice::kSlotPackedKeys, 0, static_cast<size_t>(total_packed) * block_bytes));
    std::vector<std::pair<int32_t, int64_t>> jobs;  // (seq, chunk of all its kv heads)
    jobs.reserve(total_packed);
    for (size_t si = 0; si < seqs.size(); ++si) {
      if (pack_base[si] < 0) continue;
      const int64_t nch = (seqs[si].context_len + kChunk - 1) / kChunk;
      for (int64_t j = 0; j < L.num_kv_heads * nch; ++j) jobs.push_back({static_cast<int32_t>(si), j});
    }
#pragma omp parallel for num_threads(dev.threads()) schedule(static)
    for (size_t j = 0; j < jobs.size(); ++j) {
      const auto [si, gc] = jobs[j];
      const PagedSequence& s = seqs[si];
      const int64_t nch = (s.context_len + kChunk - 1) / kChunk;
      const int g = static_cast<int>(gc / nch);
      const int64_t c = gc % nch;
      const int kn = static_cast<int>(std::min<int64_t>(kChunk, s.context_len - c * kChunk));
      const T* krows[kChunk];
      const T* vrows[kChunk];
      GatherRows(L, s, g, c * kChunk, kn, krows, vrows);
      PackBlock<kBf16>(sh, layout, krows, vrows, kn, packed + (pack_base[si] + gc) * block_bytes);
    }
  }

#pragma omp parallel num_threads(dev.threads()) if (num_items > 1)
  {
    const size_t need = (block_bytes + 64) + (static_cast<size_t>(max_q_state) * hd * 4 + 64) +
                        2 * (static_cast<size_t>(max_q_state) * 4 + 64) + (kRows * kChunk * 4 + 64) +
                        (kRows * kChunk * 2 + 64) + (static_cast<size_t>(max_q) * qb_stride * 2 + 64) +
                        4 * (kChunk * sizeof(const T*) + 64);
    Carver carve{static_cast<char*>(dev.Scratch(CpuDevice::kSlotTile, omp_get_thread_num(), need))};
    char* block_local = carve.Take<char>(block_bytes);
    TileState st;
    st.o = carve.Take<float>(static_cast<size_t>(max_q_state) * hd);
    st.m = carve.Take<float>(max_q_state);
    st.l = carve.Take<float>(max_q_state);
    st.p = carve.Take<float>(kRows * kChunk);
    st.pb = carve.Take<uint16_t>(kRows * kChunk);
    uint16_t* qb = carve.Take<uint16_t>(static_cast<size_t>(max_q) * qb_stride);
    const T** rows[2][2];  // [buffer][k, v]: this chunk's and the next chunk's pool rows
    NoPrefetch no_prefetch;
    for (auto& b : rows)
      for (auto& r : b) r = carve.Take<const T*>(kChunk);

#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < num_items; ++it) {
      const Item& item = items[it];
      const PagedSequence& s = seqs[item.seq];
      const int nq = item.nrows * group;
      const int64_t pos0 = s.context_len - s.q_len + item.row0;  // position of the item's first row
      const int64_t kend = pos0 + item.nrows;                    // keys [0, kend)
      const int64_t nchunks = (kend + kChunk - 1) / kChunk;
      const int h0 = item.g * group;
      auto q_ptr = [&](int r) {
        return a.q + (s.q_begin + item.row0 + r / group) * a.q_row_stride + static_cast<int64_t>(h0 + r % group) * hd;
      };
      auto out_ptr = [&](int r) {
        return a.out + (s.q_begin + item.row0 + r / group) * a.out_row_stride +
               static_cast<int64_t>(h0 + r % group) * hd;
      };
      for (int r = 0; r < (nq + kRows - 1) / kRows * kRows; ++r) {
        st.m[r] = kNegInf;
        st.l[r] = 0.f;
      }
      if constexpr (kBf16) RoundRowsToBf16(nq, q_ptr, hd, qb_stride, qb);
      const int tiles = (nq + kRows - 1) / kRows;
      // Few tiles (decode: 1 row x group heads): prefetches go inside the loops. Many tiles:
      // a slice before each tile, keeping the inner loops free of them.
      const bool in_loop = tiles <= kInLoopPrefetchTiles;
      const int qk_steps = kBf16 ? sh.hp : hd;
      int pv_groups = 0;  // calls of PvChunk per tile, as Tile splits head_dim
      for (int left = sh.ndv; left > 0; ++pv_groups) left -= PvVectors(left);
      TileInputs<IndirectRowsOf<T>> in{};
      // This item's packed chunk c: prepacked, or packed here into block_local.
      const bool prepacked = pack_base[item.seq] >= 0;
      const int64_t seq_chunks = (s.context_len + kChunk - 1) / kChunk;
      auto packed_chunk = [&](int64_t c) {
        return packed + (pack_base[item.seq] + item.g * seq_chunks + c) * block_bytes;
      };
      GatherRows(L, s, item.g, 0, static_cast<int>(std::min<int64_t>(kChunk, kend)), rows[0][0], rows[0][1]);
      for (int64_t c = 0; c < nchunks; ++c) {
        const int64_t kb0 = c * kChunk;
        const int kn = static_cast<int>(std::min<int64_t>(kChunk, kend - kb0));
        const T** krows = rows[c & 1][0];
        const T** vrows = rows[c & 1][1];
        // The next chunk's rows, prefetched into L2 while this one computes: spread over the
        // loop iterations the chunk's tiles will run (QK over head_dim, P·V over keys for each
        // group of up to 5 head_dim vectors).
        Prefetcher pf;
        const float* next_block = nullptr;
        if (c + 1 < nchunks) {
          const int kn_next = static_cast<int>(std::min<int64_t>(kChunk, kend - kb0 - kChunk));
          const T** nk = rows[(c + 1) & 1][0];
          const T** nv = rows[(c + 1) & 1][1];
          GatherRows(L, s, item.g, kb0 + kChunk, kn_next, nk, nv);
          if (prepacked) {
            next_block = reinterpret_cast<const float*>(packed_chunk(c + 1));
            pf.Add(&next_block, 1, static_cast<int>(kBf16 ? block_bytes : layout.kt_bytes), true);
          } else {
            pf.Add(nk, kn_next, row_bytes, rows_aligned);
          }
          if (!(prepacked && kBf16)) pf.Add(nv, kn_next, row_bytes, rows_aligned);
          const int64_t steps =
              in_loop ? static_cast<int64_t>(tiles) * (qk_steps + pv_groups * (kBf16 ? (kn + 1) / 2 : kn)) : tiles;
          pf.per_step = static_cast<int>((pf.Lines() + steps - 1) / steps);
        }
        const char* blk = block_local;
        if (prepacked) {
          blk = packed_chunk(c);
        } else {
          PackBlock<kBf16>(sh, layout, krows, vrows, kn, block_local);
        }
        in.kt = reinterpret_cast<const float*>(blk);
        in.ktb = reinterpret_cast<const uint32_t*>(blk);
        in.vb = reinterpret_cast<const uint16_t*>(blk + layout.vb_offset);
        in.v = IndirectRowsOf<T>{vrows, 0};
        const bool first = c == 0, last = c == nchunks - 1;
        for (int ti = 0; ti < tiles; ++ti) {
          const int t = ti * kRows;
          int64_t qpos[kRows];
          float* out_rows[kRows];
          for (int r = 0; r < kRows; ++r) {
            const int i = std::min(t + r, nq - 1);  // q vectors past the item repeat its last one
            in.q_rows[r] = q_ptr(i);
            in.qb_rows[r] = qb + static_cast<size_t>(i) * qb_stride;
            qpos[r] = pos0 + i / group;
            out_rows[r] = out_ptr(i);
          }
          const int rows_valid = std::min(kRows, nq - t);
          if (in_loop) {
            TileForKeys<kBf16>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t, pf);
          } else {
            pf.Step();
            TileForKeys<kBf16>(sh, in, qpos, kb0, kn, first, last, out_rows, rows_valid, st, t, no_prefetch);
          }
        }
        pf.Finish();
      }
    }
  }
}

}  // namespace

void PagedAttention(CpuDevice& dev, const PagedAttentionArgs& a) {
  const PagedKvLayer& L = a.layer;
  const std::vector<PagedSequence> seqs = CheckedPagedSequences(a);
  if (seqs.empty()) return;
  const int group = a.num_heads / L.num_kv_heads;
  // Rows per item: all q heads of a group for up to kTargetQ q vectors.
  const int tile_rows = std::max(1, kTargetQ / group);

  std::vector<Item> items;
  int max_q = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const PagedSequence& s = seqs[si];
    for (int64_t r0 = 0; r0 < s.q_len; r0 += tile_rows) {
      const int nrows = static_cast<int>(std::min<int64_t>(tile_rows, s.q_len - r0));
      const int64_t keys = s.context_len - s.q_len + r0 + nrows;
      for (int g = 0; g < L.num_kv_heads; ++g) {
        items.push_back({static_cast<int32_t>(si), g, static_cast<int32_t>(r0), nrows,
                         static_cast<int64_t>(nrows) * group * keys});
      }
      max_q = std::max(max_q, nrows * group);
    }
  }
  if (items.empty()) return;
  // Longest first, so that the dynamic schedule ends with short items (causal prefill tiles and
  // decodes over short contexts).
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });

  const bool bf16_pages = L.dtype == core::DType::kBF16;
  if (a.bf16 && dev.native_bf16()) {
    if (bf16_pages) return Run<true, uint16_t>(dev, a, seqs, items, group, max_q);
    return Run<true, float>(dev, a, seqs, items, group, max_q);
  }
  if (bf16_pages) return Run<false, uint16_t>(dev, a, seqs, items, group, max_q);
  Run<false, float>(dev, a, seqs, items, group, max_q);
}

}  // namespace iris::kernels::cpu::avx512
IRIS_AVX512_END
