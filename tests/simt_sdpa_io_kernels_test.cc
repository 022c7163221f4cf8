// The kernels around cuDNN's SDPA (kernels/cuda/sdpa_io_kernels.cuh) on the SIMT harness, so CI
// checks them without a GPU: the sequence lengths and ragged offsets from cu_seqlens; q, k and v
// gathered from the encoder's interleaved qkv rows (and from head-major padded buffers, and with
// fewer kv heads) into packed bf16, each element the CPU's rounding of its source; the bf16 output
// widened into strided f32 rows, padding columns untouched. Odd sizes and grids smaller than the
// work, so the strided loops go round.
// (Not named cuda_*: that prefix means label gpu, and this suite is for machines without one.)
#include "kernels/cuda/sdpa_io_kernels.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "tests/kernel_cases.h"

namespace iris::kernels::cuda {
namespace {

using testing::RandomNormal;

TEST(SdpaIoKernelsOnSimtTest, MetadataFromCuSeqlens) {
  const std::vector<int32_t> cu = {0, 5, 5, 69, 70, 200};  // an empty sequence among them
  const int b = static_cast<int>(cu.size()) - 1;
  const int32_t q_row = 16 * 80, kv_row = 2 * 80;
  std::vector<int32_t> seq_len(b, -1), q_off(b + 1, -1), kv_off(b + 1, -1);
  Launch(Dim3(1), Dim3(4), SdpaMetaKernel, cu.data(), b, q_row, kv_row, seq_len.data(), q_off.data(), kv_off.data());
  for (int s = 0; s <= b; ++s) {
    EXPECT_EQ(q_off[s], cu[s] * q_row) << s;
    EXPECT_EQ(kv_off[s], cu[s] * kv_row) << s;
    if (s < b) {
      EXPECT_EQ(seq_len[s], cu[s + 1] - cu[s]) << s;
    }
  }
}

// One layout of q, k, v sources: strides in floats.
struct Sources {
  std::vector<float> data;
  SdpaSource q, k, v;
};

TEST(SdpaIoKernelsOnSimtTest, PackGathersEachHeadRoundedLikeTheCpu) {
  const int64_t rows = 37;
  const int d = 40;
  for (const auto& [hq, hkv, interleaved] : {std::tuple{3, 3, true}, {4, 2, true}, {3, 1, false}}) {
    SCOPED_TRACE(::testing::Message() << hq << "/" << hkv << " heads, " << (interleaved ? "qkv rows" : "head-major"));
    Sources src;
    const int64_t q_cols = int64_t{hq} * d, kv_cols = int64_t{hkv} * d;
    src.data = RandomNormal(rows * (q_cols + 2 * kv_cols) + 64, 7 + hq, 2.f);
    const float* base = src.data.data();
    if (interleaved) {  // the qkv projection's rows: [q heads | k heads | v heads] per row
      const int64_t stride = q_cols + 2 * kv_cols;
      src.q = {base, stride, d};
      src.k = {base + q_cols, stride, d};
      src.v = {base + q_cols + kv_cols, stride, d};
    } else {  // head-major buffers, head h of row r at h * rows * d + r * d
      src.q = {base, d, rows * d};
      src.k = {base + rows * q_cols, d, rows * d};
      src.v = {base + rows * (q_cols + kv_cols), d, rows * d};
    }
    std::vector<uint16_t> q(rows * q_cols), k(rows * kv_cols), v(rows * kv_cols);
    Launch(Dim3(2, 5), Dim3(64), SdpaPackKernel, src.q, src.k, src.v, rows, hq, hkv, d, q.data(), k.data(), v.data());
    auto check = [&](const SdpaSource& s, const std::vector<uint16_t>& got, int heads, const char* name) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int h = 0; h < heads; ++h) {
          for (int i = 0; i < d; ++i) {
            const float want = s.data[r * s.row_stride + h * s.head_stride + i];
            ASSERT_EQ(got[(r * heads + h) * d + i], core::FloatToBf16(want))
                << name << " row " << r << " head " << h << " dim " << i;
          }
        }
      }
    };
    check(src.q, q, hq, "q");
    check(src.k, k, hkv, "k");
    check(src.v, v, hkv, "v");
  }
}

TEST(SdpaIoKernelsOnSimtTest, UnpackWidensIntoStridedRowsAndLeavesTheRestAlone) {
  const int64_t rows = 29, cols = 3 * 40, stride = cols + 13;
  const std::vector<float> values = RandomNormal(rows * cols, 11, 4.f);
  std::vector<uint16_t> o(rows * cols);
  for (int64_t e = 0; e < rows * cols; ++e) o[e] = core::FloatToBf16(values[e]);
  const float kUntouched = -1234.5f;
  std::vector<float> out(rows * stride, kUntouched);
  Launch(Dim3(1, 4), Dim3(32), SdpaUnpackKernel, static_cast<const uint16_t*>(o.data()), rows, cols, out.data(),
         stride);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < stride; ++c) {
      const float got = out[r * stride + c];
      if (c >= cols) {
        ASSERT_EQ(got, kUntouched) << "padding written at row " << r << " col " << c;
      } else {
        ASSERT_EQ(got, core::Bf16ToFloat(o[r * cols + c])) << "row " << r << " col " << c;
      }
    }
  }
}

}  // namespace
}  // namespace iris::kernels::cuda
