// A paged prefill on the tensor cores (and, below, decode rows with a kv head's q heads as one
// tile's rows): causal attention of a step's prefill rows (a sequence's
// new tokens, the last of its context) over its keys in the paged KV cache, bf16 pages. Device
// code against simt.h (nvcc builds it in attention_kernels.cu; the SIMT harness runs it in CI).
//
// flash_mma.cuh's kernel with the cache's addressing: a block owns 64 query rows of one
// (sequence, q head) (grid (sequences, ceil(max_query_len / 64), num_heads)), row i of the
// sequence's chunk sits at position context_len - q_len + i and sees keys [0, position], and a
// tile's K and V rows are read through the sequence's block table, 16 and 8 bytes a load. The
// numerics are the tensor-core kernel's (AttentionArgs::bf16, the CPU's bf16 path): q and the
// probabilities rounded to bf16 (the pages are bf16 already), products exact, softmax and sums
// in f32. What it replaces for such rows, PagedAttentionKernel (kernels.cuh), computes each
// (row, head) in a block of its own on the CUDA cores: right for a decode's one row, but a
// prefill's rows each walk the context again there.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/decode_rotary.cuh"
#include "kernels/cuda/flash_mma.cuh"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/split_merge.cuh"

namespace iris::kernels::cuda {

// Sequence s's K and V rows at kv head g, through its block table (bf16 pages).
struct PagedKvRows {
  const uint16_t* k_pool;
  const uint16_t* v_pool;
  const int32_t* table;
  int block_size;
  int64_t row_elems, head_at;
  IRIS_DEVICE int64_t At(int key) const {
    return (static_cast<int64_t>(table[key / block_size]) * block_size + key % block_size) * row_elems + head_at;
  }
  IRIS_DEVICE const uint16_t* K(int key) const { return k_pool + At(key); }
  IRIS_DEVICE const uint16_t* V(int key) const { return v_pool + At(key); }
};
IRIS_DEVICE PagedKvRows PagedKvRowsOf(const PagedPrefillParams& pp, int s, int g) {
  return PagedKvRows{pp.k_pool,
                     pp.v_pool,
                     pp.block_tables + static_cast<int64_t>(s) * pp.max_blocks_per_seq,
                     pp.block_size,
                     static_cast<int64_t>(pp.num_kv_heads) * pp.head_dim,
                     static_cast<int64_t>(g) * pp.head_dim};
}

// Three blocks an SM up to head dim 64, two past it (the decoders' 128: 249 registers; at 80 three
// would spill).
template <int kDim>
IRIS_GLOBAL void IRIS_LAUNCH_BOUNDS(kMmaFlashThreads, kDim <= 64 ? 3 : 2) PagedPrefillMmaKernel(PagedPrefillParams pp) {
  static_assert(kDim % 16 == 0 && kDim <= kMmaFlashMaxHeadDim);
  IRIS_SHARED uint32_t ks[kMmaFlashKeys * kMmaFlashKWords<kDim>];  // ks[key][dim pair]
  IRIS_SHARED uint32_t vt[kDim * kMmaFlashVWords];                  // vt[dim][key pair]

  const int s = pp.seq_begin + static_cast<int>(blockIdx.x);
  const int q0 = pp.query_start[s], q_len = pp.query_start[s + 1] - q0, context = pp.context_lens[s];
  const int offset = context - q_len;  // chunk row i is at position offset + i
  // The flash helpers' view of the block: the chunk's rows as a sequence of q_len rows from row
  // q0, its keys shifted by `offset`.
  MmaFlashBlock b;
  b.r_lo = static_cast<int>(blockIdx.y) * kMmaFlashRows;
  b.r_hi = q_len < b.r_lo + kMmaFlashRows ? q_len : b.r_lo + kMmaFlashRows;
  if (b.r_lo >= b.r_hi) return;  // the whole block (a decode's one row, or past a short chunk)
  b.start = q0;
  b.n = q_len;
  b.h = static_cast<int>(blockIdx.z);
  b.g = b.h / (pp.num_heads / pp.num_kv_heads);
  MmaFlashPlaceLane(b);
  b.key_end = offset + b.r_hi;
  b.visible_a = offset + b.row_a + 1 < context ? offset + b.row_a + 1 : context;
  b.visible_b = offset + b.row_a + 9 < context ? offset + b.row_a + 9 : context;
  // q's rows and the output rows as the flash helpers read them.
  FlashVarlenParams p;
  p.q = pp.q;
  p.q_row_stride = pp.q_row_stride;
  p.q_head_stride = pp.head_dim;
  p.out = pp.out;
  p.out_row_stride = pp.out_row_stride;
  p.head_dim = pp.head_dim;
  p.scale = pp.scale;

  const PagedKvRows kv = PagedKvRowsOf(pp, s, b.g);
  const auto k_row = [&](int key) { return kv.K(key); };
  const auto v_row = [&](int key) { return kv.V(key); };

  uint32_t qa[kDim / 16][4];
  MmaFlashLoadQ<kDim, false>(p, b, qa);
  MmaFlashRowState<kDim> st;
  for (int kb = 0; kb < b.key_end; kb += kMmaFlashKeys) {
    SyncThreads();  // the previous tile is read
    MmaFlashLoadTileBf16Rows<kDim>(k_row, v_row, kb, b.key_end, pp.head_dim, b.tid, ks, vt);
    SyncThreads();
    // A tile wholly after the warp's last row's position adds nothing to it.
    if (!b.warp_active || kb > offset + b.warp_row0 + 15) continue;
    MmaFlashTile<kDim>(p, b, kb, qa, ks, vt, st);
  }
  MmaFlashStore<kDim, false>(p, b, st);
  SyncThreads();  // the shared tiles are read before a next block (harness) reuses them
}

// The lane's rows' online-softmax state as a split's partial [m, l, acc] (acc unnormalised; m in
// natural units, as split_merge.cuh's merges read it; m = -inf and l = 0 where the split saw no
// key), at part_of(r) for tile row r < r_hi.
template <int kDim, typename PartOf>
IRIS_DEVICE void MmaFlashStorePartial(const MmaFlashBlock& b, int hd, MmaFlashRowState<kDim>& st, PartOf part_of) {
  if (!b.warp_active) return;
IRIS_UNROLL
  for (int x = 0; x < 2; ++x) {
    st.l[x] += ShflXor(st.l[x], 1);
    st.l[x] += ShflXor(st.l[x], 2);
  }
IRIS_UNROLL
  for (int x = 0; x < 2; ++x) {
    const int r = b.row_a + 8 * x;
    if (r < b.r_lo || r >= b.r_hi) continue;
    float* part = part_of(r);
    if (b.t == 0) {
      part[0] = st.m[x] * kMmaFlashLn2;
      part[1] = st.l[x];
    }
IRIS_UNROLL
    for (int c = 0; c < kDim / 8; ++c) {
      const int d = 8 * c + 2 * b.t;
      if (d < hd) part[2 + d] = st.acc[c][2 * x];
      if (d + 1 < hd) part[3 + d] = st.acc[c][2 * x + 1];
    }
  }
}

// The online-softmax states of `warps` warps that hold the same rows over disjoint keys, merged
// into warp 0's (lane by lane: a lane's fragments are the same rows and dims in every warp), in
// log2(warps) rounds through `scratch` (shared memory of 64 * (4 + kDim / 2) floats, which is
// ks's size: the upper half of the remaining warps hands its states to the lower half). A state
// that saw no key (m = -inf) weighs nothing; all of them: the state stays empty. Every thread of
// the block calls it (barriers).
template <int kDim, int kWarps>
IRIS_DEVICE void MmaFlashMergeWarpStates(const MmaFlashBlock& b, MmaFlashRowState<kDim>& st, float* scratch) {
  static_assert(kWarps <= kMmaFlashWarps && (kWarps & (kWarps - 1)) == 0);
  constexpr int kSlots = 2 * kWarpSize;           // (kWarps / 2) * 32 lanes at the first round
  constexpr int kFloats = 4 + kDim / 2;            // m[2], l[2], acc
  static_assert(kSlots * kFloats == kMmaFlashKeys * kMmaFlashKWords<kDim>);
  // Element e of slot s at scratch[e * kSlots + s]: a warp's 32 lanes write 32 consecutive words.
  for (int half = kWarps / 2; half >= 1; half /= 2) {
    if (b.warp >= half && b.warp < 2 * half) {
      float* at = scratch + (b.warp - half) * kWarpSize + b.lane;
      at[0 * kSlots] = st.m[0];
      at[1 * kSlots] = st.m[1];
      at[2 * kSlots] = st.l[0];
      at[3 * kSlots] = st.l[1];
IRIS_UNROLL
      for (int c = 0; c < kDim / 8; ++c) {
IRIS_UNROLL
        for (int i = 0; i < 4; ++i) at[(4 + 4 * c + i) * kSlots] = st.acc[c][i];
      }
    }
    SyncThreads();
    if (b.warp < half) {
      const float* at = scratch + b.warp * kWarpSize + b.lane;
      float mine[2], theirs[2];
IRIS_UNROLL
      for (int x = 0; x < 2; ++x) {
        const float mo = at[x * kSlots];
        const float top = mo > st.m[x] ? mo : st.m[x];
        mine[x] = theirs[x] = 0.f;
        if (top != -INFINITY) {
          mine[x] = st.m[x] == -INFINITY ? 0.f : Exp2Approx(st.m[x] - top);  // m in base-2 units
          theirs[x] = mo == -INFINITY ? 0.f : Exp2Approx(mo - top);
          st.m[x] = top;
        }
        st.l[x] = st.l[x] * mine[x] + at[(2 + x) * kSlots] * theirs[x];
      }
IRIS_UNROLL
      for (int c = 0; c < kDim / 8; ++c) {
IRIS_UNROLL
        for (int i = 0; i < 4; ++i) {
          st.acc[c][i] = st.acc[c][i] * mine[i / 2] + at[(4 + 4 * c + i) * kSlots] * theirs[i / 2];
        }
      }
    }
    SyncThreads();  // read before the next round writes
  }
}

// Decode rows with GQA packing: a block per (step row, split, kv head) (grid (rows, splits,
// num_kv_heads)), whose tile rows are that kv head's q heads at the row (q heads g * G + [0, G),
// G = num_heads / num_kv_heads, at most 64): the row's keys, through its block table, are loaded
// once into shared memory for all G heads, where PagedAttentionKernel reads them again for each q
// head (a block per (row, q head)), G times the L2 traffic and G times the blocks. The rows see
// keys [0, position] (position = context_len - q_len + the row's index in its sequence: a decode
// row sees its whole context). The tile rows past G are zeros, never stored; warps whose 16 rows
// are all past G only help load the tiles. The prefill kernel's numerics.
// With splits (gridDim.y > 1: few rows, to fill the GPU), split y takes its share of the row's
// 64-key tiles and writes partials (pp.partials, PagedPartialIndex's layout); the last split of a
// (row, kv head) to arrive (pp.split_counters[row index * num_kv_heads + g], left at zero) merges
// them into the output, as PagedAttentionKernel's splits do.
// kKeySlices = 4 (PagedDecodeMmaKeySlices: G <= 16, every Qwen2.5 decoder's group): the group fits
// one warp's 16 rows, so every warp holds them and takes its own 16 keys of each tile, with an
// online softmax of its own, and the four states merge in shared memory at the end; with one warp
// computing (kKeySlices = 1), it alone would issue the tile's 128 mma.sync while three only load.
// kRotary (with key slices; a step of decode rows only, pp.rotary): the step's rotary and KV write
// are this kernel's too, as PagedAttentionKernel's kRotary does them: the group's q heads rotated
// into shared memory before the fragments are loaded, the row's own key and value rotated and
// rounded from its qkv rows and read from shared memory by the tile loads, split 0 of each (row,
// kv head) storing them into the row's slot. The same output and pools as RotaryQKWriteKvKernel
// then this kernel without it, bit for bit.
template <int kDim, int kKeySlices, bool kRotary = false>
IRIS_GLOBAL void IRIS_LAUNCH_BOUNDS(kMmaFlashThreads, kDim <= 64 ? 3 : 2) PagedDecodeMmaKernel(PagedPrefillParams pp) {
  static_assert(kDim % 16 == 0 && kDim <= kMmaFlashMaxHeadDim);
  static_assert(kKeySlices == 1 || kKeySlices == kMmaFlashWarps);
  static_assert(!kRotary || kKeySlices > 1, "the rotary's q rows fit vt for a group of at most 16");
  constexpr int kSliceKeys = kMmaFlashKeys / kKeySlices;
  IRIS_SHARED uint32_t ks[kMmaFlashKeys * kMmaFlashKWords<kDim>];  // ks[key][dim pair]
  IRIS_SHARED uint32_t vt[kDim * kMmaFlashVWords];                  // vt[dim][key pair]
  IRIS_SHARED int merges_splits;
  IRIS_SHARED float split_weight[kMmaFlashRows][kPagedDecodeMmaMaxSplits];  // the merging block's
  // kRotary: the row's own key, then its value, bf16 (16-byte aligned, as the tile loads read).
  IRIS_SHARED Chunk16 cur_kv[kRotary ? 2 * kDim * 2 / 16 : 1];

  const int64_t row_index = blockIdx.x;
  const int64_t row = pp.decode_row_begin + row_index;
  // The sequence holding this row: the last s with query_start[s] <= row.
  int lo = 0, hi = pp.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (pp.query_start[mid] <= row) lo = mid; else hi = mid - 1;
  }
  const int s = lo;
  const int q0 = pp.query_start[s], q_len = pp.query_start[s + 1] - q0;
  const int keys = pp.context_lens[s] - q_len + static_cast<int>(row - q0) + 1;
  const int group = pp.num_heads / pp.num_kv_heads;
  const int splits = static_cast<int>(gridDim.y), split = static_cast<int>(blockIdx.y);
  MmaFlashBlock b;
  b.start = 0;
  b.n = group;
  b.r_lo = 0;
  b.r_hi = group;
  b.h = 0;
  b.g = static_cast<int>(blockIdx.z);
  MmaFlashPlaceLane(b);
  // Warp w holds tile rows [16w, 16w + 16) (blockIdx.y is the split here, not a row block), or,
  // with key slices, every warp rows [0, 16).
  b.warp_row0 = kKeySlices == 1 ? b.warp * 16 : 0;
  b.warp_active = b.warp_row0 < b.r_hi;
  b.row_a = b.warp_row0 + b.group;
  b.key_end = keys;
  b.visible_a = keys;
  b.visible_b = keys;
  // The tile's rows are the group's q heads, head_dim apart in the row; so are the outputs.
  const int64_t first_head = static_cast<int64_t>(b.g) * group * pp.head_dim;
  FlashVarlenParams p;
  p.q = pp.q + row * pp.q_row_stride + first_head;
  p.q_row_stride = pp.head_dim;
  p.q_head_stride = 0;
  p.out = pp.out + row * pp.out_row_stride + first_head;
  p.out_row_stride = pp.head_dim;
  p.head_dim = pp.head_dim;
  p.scale = pp.scale;

  const PagedKvRows kv = PagedKvRowsOf(pp, s, b.g);
  const auto k_row = [&](int key) -> const uint16_t* {
    if constexpr (kRotary) {
      if (key == keys - 1) return reinterpret_cast<const uint16_t*>(cur_kv);
    }
    return kv.K(key);
  };
  const auto v_row = [&](int key) -> const uint16_t* {
    if constexpr (kRotary) {
      if (key == keys - 1) return reinterpret_cast<const uint16_t*>(cur_kv) + kDim;
    }
    return kv.V(key);
  };
  if constexpr (kRotary) {
    // The group's q heads rotated, as f32 rows in vt's words (free until the first tile), where
    // the fragment loads below read them; the row's key and value into cur_kv.
    const int hd = pp.head_dim;
    float* q_rot = reinterpret_cast<float*>(vt);
    uint16_t* ck = reinterpret_cast<uint16_t*>(cur_kv);
    RotateDecodeHeads(pp.rotary, row, p.q, group, hd, q_rot, b.tid, kMmaFlashThreads);
    LoadOwnKv(pp.rotary, row, b.g, hd, ck, ck + kDim, b.tid, kMmaFlashThreads);
    SyncThreads();
    p.q = q_rot;
    // Split 0 stores the row's key and value for the steps after; no block of this launch reads
    // that slot.
    if (split == 0) {
      StoreOwnKv(pp.rotary, row, int64_t{pp.num_kv_heads} * hd, b.g, hd, ck, ck + kDim, b.tid, kMmaFlashThreads);
    }
  }

  // This split's tiles: the row's ceil(keys / 64) in `splits` runs of `per` (the last runs may be
  // short or empty).
  const int tiles = (keys + kMmaFlashKeys - 1) / kMmaFlashKeys;
  const int per = (tiles + splits - 1) / splits;
  const int kb_begin = split * per * kMmaFlashKeys;
  const int kb_end = (split + 1) * per * kMmaFlashKeys < keys ? (split + 1) * per * kMmaFlashKeys : keys;

  uint32_t qa[kDim / 16][4];
  MmaFlashLoadQ<kDim, false>(p, b, qa);
  MmaFlashRowState<kDim> st;
  if constexpr (kRotary) SyncThreads();  // the rotated q rows are read before the tiles take vt
  for (int kb = kb_begin; kb < kb_end; kb += kMmaFlashKeys) {
    SyncThreads();  // the previous tile is read
    MmaFlashLoadTileBf16Rows<kDim>(k_row, v_row, kb, b.key_end, pp.head_dim, b.tid, ks, vt);
    SyncThreads();
    if (b.warp_active) MmaFlashTile<kDim, kSliceKeys>(p, b, kb, qa, ks, vt, st, b.warp * kSliceKeys % kMmaFlashKeys);
  }
  if constexpr (kKeySlices > 1) {
    SyncThreads();  // the last tile is read: ks becomes the merge's scratch
    MmaFlashMergeWarpStates<kDim, kKeySlices>(b, st, reinterpret_cast<float*>(ks));
    b.warp_active = b.warp == 0;  // warp 0 holds the merged state: it alone stores
  }
  if (splits == 1) {
    MmaFlashStore<kDim, false>(p, b, st);
    SyncThreads();  // the shared tiles are read before a next block (harness) reuses them
    return;
  }
  const int hd = pp.head_dim;
  MmaFlashStorePartial<kDim>(b, hd, st, [&](int r) {
    return pp.partials + PagedPartialIndex(row_index, b.g * group + r, pp.num_heads, split, splits, hd);
  });
  ThreadFence();  // this thread's share of the partials is visible GPU-wide before the arrival counts
  SyncThreads();
  if (b.tid == 0) {
    int* counter = pp.split_counters + row_index * pp.num_kv_heads + b.g;
    const bool last = AtomicAddInt(counter, 1) == splits - 1;
    if (last) *counter = 0;  // every split has arrived: zero again for the next launch
    merges_splits = last ? 1 : 0;
  }
  SyncThreads();
  if (merges_splits != 0) {
    ThreadFence();
    // Each row's weight for each split, exp(m_z - max) / the rescaled sum, once (a thread a row),
    // then each output element is its splits' accumulators so weighted.
    const int64_t ps = 2 + static_cast<int64_t>(hd);
    const auto part_of = [&](int r) {
      return pp.partials + PagedPartialIndex(row_index, b.g * group + r, pp.num_heads, 0, splits, hd);
    };
    for (int r = b.tid; r < group; r += static_cast<int>(blockDim.x)) {
      const float* part = part_of(r);
      float top, sum_l;
      MergedMaxAndSum(part, part + 1, ps, splits, &top, &sum_l, CoherentLoad{});
      for (int z = 0; z < splits; ++z) {
        const float mz = LoadCoherent(part + z * ps);
        split_weight[r][z] = mz == -INFINITY ? 0.f : expf(mz - top) / sum_l;
      }
    }
    SyncThreads();
    for (int e = b.tid; e < group * hd; e += static_cast<int>(blockDim.x)) {
      const int r = e / hd, d = e % hd;
      const float* part = part_of(r);
      float sum = 0.f;
      for (int z = 0; z < splits; ++z) {
        if (split_weight[r][z] != 0.f) sum += LoadCoherent(part + z * ps + 2 + d) * split_weight[r][z];
      }
      p.out[static_cast<int64_t>(r) * hd + d] = sum;
    }
  }
  SyncThreads();  // the shared tiles and flag are read before a next block (harness) reuses them
}

// f(the decode kernel for head_dim and key_slices (PagedDecodeMmaKeySlices)): the launch and the
// harness tests pick the instantiation the same way.
// With `rotary` (key slices only), the kernel that does the step's rotary and KV write too.
template <typename F>
void WithPagedDecodeMmaKernel(int head_dim, int key_slices, bool rotary, F&& f) {
  WithMmaFlashDim(head_dim, [&](auto dim) {
    if (key_slices > 1 && rotary) {
      f(PagedDecodeMmaKernel<decltype(dim)::value, kMmaFlashWarps, true>);
    } else if (key_slices > 1) {
      f(PagedDecodeMmaKernel<decltype(dim)::value, kMmaFlashWarps, false>);
    } else {
      f(PagedDecodeMmaKernel<decltype(dim)::value, 1, false>);
    }
  });
}

}  // namespace iris::kernels::cuda
