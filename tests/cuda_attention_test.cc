// VarlenAttention through its dispatch point on a GPU (label gpu), against the CPU kernel and a
// double-precision reference: the vision tower's window and full attention shapes (head dim 80,
// q/k/v read in place from the fused qkv rows), the decoder's causal GQA at head dim 128, and a
// clipped row range (the encoder's resumable pieces); and cuDNN's SDPA where the device is set to it.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/attention_projection.h"
#include "kernels/device.h"
#include "kernels/linear.h"
#ifdef IRIS_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cudnn_sdpa.h"
#endif
#include "tests/attention_cases.h"
#include "tests/kernel_cases.h"

namespace iris::kernels {
namespace {

#ifdef IRIS_HAVE_CUDA

using testing::ExpectCloseRel;
using testing::ExpectRowsOfWholeAndRestUntouched;
using testing::VarlenCase;
using testing::VarlenShape;

// n values of `dtype` from host memory, in a new device tensor.
core::Tensor Upload(Device& gpu, const void* host, core::DType dtype, int64_t n) {
  absl::StatusOr<core::Tensor> t = gpu.Allocate(dtype, {n});
  EXPECT_TRUE(t.ok()) << t.status();
  gpu.CopyToDevice(host, t->data<char>(), t->nbytes());
  return *std::move(t);
}

// The case's result on cuda:0 through kernels::VarlenAttention.
// bf16: the bf16 compute mode's kernel (tensor cores).
std::vector<float> RunOnGpu(Device& gpu, const VarlenCase& c, int64_t q_begin = 0, int64_t q_end = -1,
                            bool bf16 = false, bool with_num_rows = false) {
  auto up = [&](const void* host, core::DType dtype, int64_t n) { return Upload(gpu, host, dtype, n); };
  const core::Tensor qkv = up(c.qkv.data(), core::DType::kF32, static_cast<int64_t>(c.qkv.size()));
  const core::Tensor cu = up(c.cu.data(), core::DType::kI32, static_cast<int64_t>(c.cu.size()));
  std::vector<float> out(static_cast<size_t>(c.rows) * c.out_stride(), NAN);
  core::Tensor dout = up(out.data(), core::DType::kF32, static_cast<int64_t>(out.size()));
  AttentionArgs a = c.Args(qkv.data<float>(), cu.data<int32_t>(), dout.data<float>());
  a.q_begin = q_begin;
  a.q_end = q_end;
  a.bf16 = bf16;
  if (with_num_rows) a.num_rows = c.rows;
  VarlenAttention(gpu, a);
  gpu.CopyToHost(dout.data<float>(), out.data(), out.size() * sizeof(float));
  return out;
}

// The shapes both kernels are checked on.
const VarlenShape kShapes[] = {
    {{64, 64, 64, 64, 1, 333}, 16, 16, 80, 80, false},  // windows of the 3b vision tower
    {{1024}, 16, 16, 80, 80, false},                    // one of its full-attention blocks
    {{1, 77, 300}, 16, 2, 128, 128, true},              // a decoder prefill, GQA
    {{50, 3}, 4, 4, 23, 32, false},                     // odd head dim in a padded stride
};

TEST(CudaAttentionTest, VarlenMatchesTheCpuKernelAndTheDefinition) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  for (const VarlenShape& s : kShapes) {
    const VarlenCase c = s.Case();
    const std::vector<float> got = RunOnGpu(*gpu, c);
    ASSERT_TRUE(cuda::AsCuda(*gpu).status().ok()) << cuda::AsCuda(*gpu).status();
    ExpectCloseRel(got, c.CpuReference(), 1e-5f, "flash vs cpu");
    ExpectCloseRel(got, c.DoubleReference(), 1e-5f, "flash vs double");
  }
}

// The tensor-core kernel (the bf16 compute mode) against the definition on the same bf16-rounded
// inputs; what is left is the probabilities' rounding before P·V and the order of sums.
TEST(CudaAttentionTest, Bf16VarlenOnTensorCoresMatchesTheDefinitionOnBf16Inputs) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  for (const VarlenShape& s : kShapes) {
    const VarlenCase c = s.Case();
    const std::vector<float> got = RunOnGpu(*gpu, c, 0, -1, /*bf16=*/true);
    ASSERT_TRUE(cuda::AsCuda(*gpu).status().ok()) << cuda::AsCuda(*gpu).status();
    testing::ExpectWithinBf16ProbabilityRounding(got, c, "mma flash vs bf16-input definition");
    const std::vector<float> exact = c.DoubleReference();
    EXPECT_LE(testing::RelativeL2(got.data(), exact.data(), static_cast<int64_t>(got.size())), 1e-2);
  }
}

// cuDNN's SDPA (the device's "cudnn" attention) where it takes the call — bf16, non-causal, every
// row of a known count, head dim a multiple of 8 — against the same bf16-input definition as the
// tensor-core kernel; the other shapes (causal, head dim 23) go to the flash kernels and build no
// plan.
TEST(CudaAttentionTest, CudnnSdpaMatchesTheDefinitionOnBf16InputsWhereItTakesTheCall) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  cuda::CudaDevice& cuda_dev = cuda::AsCuda(*gpu);
  const absl::Status set = cuda_dev.SetAttention(cuda::CudaDevice::Attention::kCudnn);
  ASSERT_TRUE(set.ok()) << set;
  for (const VarlenShape& s : kShapes) {
    const VarlenCase c = s.Case();
    const int64_t plans_before = cuda_dev.sdpa()->plans_built();
    const std::vector<float> got = RunOnGpu(*gpu, c, 0, -1, /*bf16=*/true, /*with_num_rows=*/true);
    ASSERT_TRUE(cuda_dev.status().ok()) << cuda_dev.status();
    testing::ExpectWithinBf16ProbabilityRounding(got, c, "cudnn sdpa vs bf16-input definition");
    const bool taken = !c.causal && c.head_dim % 8 == 0;
    EXPECT_EQ(cuda_dev.sdpa()->plans_built() > plans_before, taken) << "head dim " << c.head_dim;
  }
  // A second call of a shape reuses its plan.
  const int64_t plans = cuda_dev.sdpa()->plans_built();
  (void)RunOnGpu(*gpu, kShapes[0].Case(), 0, -1, true, true);
  EXPECT_EQ(cuda_dev.sdpa()->plans_built(), plans);
}

TEST(CudaAttentionTest, ClippedRowsEqualTheWholeCall) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  const VarlenCase c({100, 257, 31}, 8, 8, 80, 80, false);
  for (const bool bf16 : {false, true}) {
    const std::vector<float> whole = RunOnGpu(*gpu, c, 0, -1, bf16);
    const std::vector<float> piece = RunOnGpu(*gpu, c, 60, 300, bf16);
    ASSERT_TRUE(cuda::AsCuda(*gpu).status().ok()) << cuda::AsCuda(*gpu).status();
    ExpectRowsOfWholeAndRestUntouched(c, whole, piece, 60, 300);
  }
}

TEST(CudaAttentionTest, AHeadDimPastTheKernelsLimitIsAnErrorNotAWrongResult) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  const VarlenCase c({5}, 1, 1, 160, 160, false);
  RunOnGpu(*gpu, c);
  const absl::Status status = cuda::AsCuda(*gpu).status();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("VarlenAttention"), std::string::npos) << status;
}

// kernels::AttendAndProject's hand-off: the flash kernel writes proj's bf16 input rows itself.
// Those are its f32 output rounded exactly as the Linear's conversion rounds it, into the same
// scratch, so y equals VarlenAttention then proj.Forward bit for bit, hand-off on or off, for
// whole and clipped row ranges and for rows a GEMV takes (where the hand-off does not apply). The
// same with q, k, v as bf16 rows, through iris's flash kernel and through its pipelined one.
TEST(CudaAttentionTest, AttendAndProjectEqualsTheAttentionThenTheProjectionBitForBit) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  cuda::CudaDevice& cuda = cuda::AsCuda(*gpu);
  // (bf16-exact values: the same inputs as the bf16 rows of the qkv chain, paths 3 and 4.)
  const VarlenCase c = VarlenShape{{64, 64, 64, 64, 1, 333}, 16, 16, 80, 80, false}.Case().RoundedToBf16();
  const int64_t width = c.out_stride();
  core::Tensor weight = core::Tensor::Empty(core::DType::kF32, {width, width}), bias = core::Tensor::Empty(core::DType::kF32, {width});
  const std::vector<float> w = testing::RandomFloats(width * width, 71), b = testing::RandomFloats(width, 72);
  std::copy(w.begin(), w.end(), weight.data<float>());
  std::copy(b.begin(), b.end(), bias.data<float>());
  absl::StatusOr<std::unique_ptr<Linear>> proj = Linear::Create(*gpu, weight, &bias, ComputeType::kBF16);
  ASSERT_TRUE(proj.ok()) << proj.status();
  auto up = [&](const void* host, core::DType dtype, int64_t n) { return Upload(*gpu, host, dtype, n); };
  const core::Tensor qkv = up(c.qkv.data(), core::DType::kF32, static_cast<int64_t>(c.qkv.size()));
  const core::Tensor cu = up(c.cu.data(), core::DType::kI32, static_cast<int64_t>(c.cu.size()));
  std::vector<uint16_t> qkv16_host(c.qkv.size());
  for (size_t i = 0; i < c.qkv.size(); ++i) qkv16_host[i] = core::FloatToBf16(c.qkv[i]);
  const core::Tensor qkv16 = up(qkv16_host.data(), core::DType::kBF16, static_cast<int64_t>(c.qkv.size()));
  const std::vector<float> staging_init(static_cast<size_t>(c.rows * width), NAN);
  const std::vector<float> y0 = testing::RandomFloats(c.rows * width, 73);
  const int64_t gemv_rows = std::min<int64_t>(cuda.gemv_max_rows(), 2);
  for (const auto& [q_begin, q_end] : {std::pair<int64_t, int64_t>{0, c.rows}, {5, 200}, {300, 300 + gemv_rows}}) {
    SCOPED_TRACE(::testing::Message() << "rows [" << q_begin << ", " << q_end << ")");
    const int64_t rows = q_end - q_begin;
    if (rows <= 0) continue;
    // Hand-off on, off, the two ops called directly; then q, k, v read from bf16 rows (the qkv
    // chain's AttentionInput::bf16) through the op with the hand-off on, and through the two ops;
    // then both again with the pipelined flash kernel (CudaDevice::SetFlashPipeline), and again
    // with two heads a block (CudaDevice::SetFlashHeadsPerBlock).
    std::vector<float> got[9];
    for (int path = 0; path < 9; ++path) {
      cuda.SetBf16Handoff(path != 1);
      cuda.SetFlashPipeline(path >= 5);
      ASSERT_TRUE(cuda.SetFlashHeadsPerBlock(path >= 7 ? 2 : 1).ok());
      core::Tensor staging = up(staging_init.data(), core::DType::kF32, c.rows * width);
      core::Tensor y = up(y0.data(), core::DType::kF32, rows * width);
      AttentionArgs a = c.Args(qkv.data<float>(), cu.data<int32_t>(), staging.data<float>());
      a.q_begin = q_begin;
      a.q_end = q_end;
      a.bf16 = true;
      if (path >= 3) {
        const uint16_t* q16 = static_cast<const uint16_t*>(qkv16.raw());
        const int64_t k_at = int64_t{c.heads} * c.head_stride, v_at = k_at + int64_t{c.kv_heads} * c.head_stride;
        a.q = {nullptr, c.row_stride(), c.head_stride, q16};
        a.k = {nullptr, c.row_stride(), c.head_stride, q16 + k_at};
        a.v = {nullptr, c.row_stride(), c.head_stride, q16 + v_at};
      }
      if (path < 2 || path == 3 || path == 5 || path == 7) {
        AttendAndProject(*gpu, a, **proj, y.data<float>());
      } else {
        VarlenAttention(*gpu, a);
        (*proj)->Forward(staging.data<float>() + q_begin * width, rows, y.data<float>(), Epilogue::kAccumulate);
      }
      got[path].resize(static_cast<size_t>(rows * width));
      gpu->CopyToHost(y.data<float>(), got[path].data(), got[path].size() * sizeof(float));
    }
    cuda.SetBf16Handoff(true);
    cuda.SetFlashPipeline(true);  // the default
    ASSERT_TRUE(cuda.SetFlashHeadsPerBlock(1).ok());
    EXPECT_FALSE(cuda.SetFlashHeadsPerBlock(3).ok());
    ASSERT_TRUE(cuda.status().ok()) << cuda.status();
    EXPECT_EQ(got[0], got[2]) << "hand-off on";
    EXPECT_EQ(got[1], got[2]) << "hand-off off";
    EXPECT_EQ(got[3], got[2]) << "bf16 inputs, hand-off on";
    EXPECT_EQ(got[4], got[2]) << "bf16 inputs, the two ops";
    EXPECT_EQ(got[5], got[2]) << "bf16 inputs, pipelined flash, hand-off on";
    EXPECT_EQ(got[6], got[2]) << "bf16 inputs, pipelined flash, the two ops";
    EXPECT_EQ(got[7], got[2]) << "bf16 inputs, pipelined flash, two heads a block, hand-off on";
    EXPECT_EQ(got[8], got[2]) << "bf16 inputs, pipelined flash, two heads a block, the two ops";
    EXPECT_NE(got[2], std::vector<float>(y0.begin(), y0.begin() + rows * width));
  }
}

// Every one of iris's flash kernels once on short cases — the f32-input and bf16-row tensor-core
// kernels, the pipelined one with one and with two q heads a block — each within the bf16
// probabilities' rounding of the definition. Small enough for compute-sanitizer's racecheck,
// which gpu_check.sh runs on this test alone (the suite's full shapes take it minutes a test).
TEST(CudaAttentionTest, EveryFlashKernelOnShortCasesForTheSanitizer) {
  std::unique_ptr<Device> gpu = testing::MakeGpuDevice();
  ASSERT_NE(gpu, nullptr);
  cuda::CudaDevice& cuda = cuda::AsCuda(*gpu);
  const VarlenShape shapes[] = {{{64, 37, 100}, 4, 4, 80, 80, false}, {{1, 30, 70}, 4, 2, 128, 128, true}};
  for (const VarlenShape& s : shapes) {
    const VarlenCase c = s.Case().RoundedToBf16();
    auto up = [&](const void* host, core::DType dtype, int64_t n) { return Upload(*gpu, host, dtype, n); };
    std::vector<uint16_t> qkv16_host(c.qkv.size());
    for (size_t i = 0; i < c.qkv.size(); ++i) qkv16_host[i] = core::FloatToBf16(c.qkv[i]);
    const core::Tensor qkv = up(c.qkv.data(), core::DType::kF32, static_cast<int64_t>(c.qkv.size()));
    const core::Tensor qkv16 = up(qkv16_host.data(), core::DType::kBF16, static_cast<int64_t>(c.qkv.size()));
    const core::Tensor cu = up(c.cu.data(), core::DType::kI32, static_cast<int64_t>(c.cu.size()));
    // (bf16 rows, pipelined, heads a block): f32 rows; bf16 rows unpipelined; pipelined, 1 and 2.
    const struct {
      bool bf16_rows, pipelined;
      int heads;
    } kernels_run[] = {{false, false, 1}, {true, false, 1}, {true, true, 1}, {true, true, 2}};
    for (const auto& k : kernels_run) {
      SCOPED_TRACE(::testing::Message() << "causal " << c.causal << ", bf16 rows " << k.bf16_rows << ", pipelined "
                                        << k.pipelined << ", heads a block " << k.heads);
      cuda.SetFlashPipeline(k.pipelined);
      ASSERT_TRUE(cuda.SetFlashHeadsPerBlock(k.heads).ok());
      const std::vector<float> init(static_cast<size_t>(c.rows) * c.out_stride(), NAN);
      core::Tensor out = up(init.data(), core::DType::kF32, static_cast<int64_t>(init.size()));
      AttentionArgs a = c.Args(qkv.data<float>(), cu.data<int32_t>(), out.data<float>());
      a.bf16 = true;
      if (k.bf16_rows) {
        const uint16_t* q16 = static_cast<const uint16_t*>(qkv16.raw());
        const int64_t k_at = int64_t{c.heads} * c.head_stride, v_at = k_at + int64_t{c.kv_heads} * c.head_stride;
        a.q = {nullptr, c.row_stride(), c.head_stride, q16};
        a.k = {nullptr, c.row_stride(), c.head_stride, q16 + k_at};
        a.v = {nullptr, c.row_stride(), c.head_stride, q16 + v_at};
      }
      VarlenAttention(*gpu, a);
      std::vector<float> got(init.size());
      gpu->CopyToHost(out.data<float>(), got.data(), got.size() * sizeof(float));
      ASSERT_TRUE(cuda.status().ok()) << cuda.status();
      testing::ExpectWithinBf16ProbabilityRounding(got, c, "flash vs bf16-input definition");
    }
  }
  cuda.SetFlashPipeline(true);  // the defaults
  ASSERT_TRUE(cuda.SetFlashHeadsPerBlock(1).ok());
}

#else
TEST(CudaAttentionTest, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

}  // namespace
}  // namespace iris::kernels
