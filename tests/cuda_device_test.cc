// The CUDA device on a real GPU (label gpu: scripts/test.sh runs it only where nvidia-smi works):
// memory and copies, the stream-ordered pool's reuse, pinned staging, and graph capture — a
// replay re-runs the recorded work, and a host synchronisation inside a capture is refused.
#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"

namespace iris::kernels {
namespace {

std::unique_ptr<Device> Gpu() {
#ifndef IRIS_HAVE_CUDA
  return nullptr;
#else
  DeviceOptions options;
  options.name = "cuda:0";
  absl::StatusOr<std::unique_ptr<Device>> d = CreateDevice(options);
  EXPECT_TRUE(d.ok()) << d.status();  // a machine that runs label gpu has one
  return d.ok() ? std::move(*d) : nullptr;
#endif
}

#define IRIS_NEED_GPU(dev)                                            \
  std::unique_ptr<Device> dev = Gpu();                                 \
  if (dev == nullptr) GTEST_SKIP() << "this build has no CUDA backend"; \
  ASSERT_EQ(dev->kind(), DeviceKind::kCuda)

TEST(CudaDeviceTest, CopiesRoundTripThroughDeviceMemory) {
  IRIS_NEED_GPU(dev);
  EXPECT_NE(dev->Describe().find("cuda:0: "), std::string::npos) << dev->Describe();
  std::vector<float> host(1000);
  std::iota(host.begin(), host.end(), 0.5f);
  auto buf = dev->Allocate(core::DType::kF32, {10, 100});
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ(buf->device(), core::Device::kCuda);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data<float>()) % 64, 0u);
  dev->CopyToDevice(host.data(), buf->data<float>(), host.size() * sizeof(float));
  std::vector<float> back(host.size(), -1.f);
  dev->CopyToHost(buf->data<float>(), back.data(), back.size() * sizeof(float));
  EXPECT_EQ(back, host);

  core::Tensor t = core::Tensor::Zeros(core::DType::kF32, {4, 3});
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i * i);
  auto mirror = dev->Mirror(t);
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  t = core::Tensor();  // the mirror is a copy: the host tensor may go at once
  std::vector<float> m(12);
  dev->CopyToHost(mirror->data<float>(), m.data(), sizeof(float) * 12);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(m[i], static_cast<float>(i * i));
}

TEST(CudaDeviceTest, FreedMemoryIsReusedAndHugeRequestsFailCleanly) {
  IRIS_NEED_GPU(dev);
  const void* first = nullptr;
  {
    auto a = dev->Allocate(core::DType::kBF16, {1 << 20});
    ASSERT_TRUE(a.ok());
    first = a->data<void>();
  }
  auto b = dev->Allocate(core::DType::kBF16, {1 << 20});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data<void>(), first);  // the pool hands the freed block back, in stream order
  auto huge = dev->Allocate(core::DType::kF32, {int64_t{1} << 40});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  auto after = dev->Allocate(core::DType::kF32, {16});  // the failure was not sticky
  EXPECT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(dev->Allocate(core::DType::kF32, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaDeviceTest, GraphReplayRerunsTheRecordedCopies) {
  IRIS_NEED_GPU(dev);
  auto staging = dev->AllocateStaging(core::DType::kF32, {256});
  auto a = dev->Allocate(core::DType::kF32, {256});
  ASSERT_TRUE(staging.ok() && a.ok());
  float* host = staging->data<float>();
  for (int i = 0; i < 256; ++i) host[i] = 1.f;
  ASSERT_TRUE(dev->BeginCapture().ok());
  dev->CopyToDevice(host, a->data<float>(), 256 * sizeof(float));  // recorded, not run
  auto graph = dev->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (float value : {2.f, 3.f}) {
    for (int i = 0; i < 256; ++i) host[i] = value + i;
    ASSERT_TRUE((*graph)->Replay().ok());
    std::vector<float> back(256);
    dev->CopyToHost(a->data<float>(), back.data(), sizeof(float) * 256);
    for (int i = 0; i < 256; ++i) ASSERT_EQ(back[i], value + i) << i;
  }
}

TEST(CudaDeviceTest, HostSynchronisationInsideACaptureIsRefused) {
  IRIS_NEED_GPU(dev);
  auto a = dev->Allocate(core::DType::kF32, {64});
  ASSERT_TRUE(a.ok());
  std::vector<float> host(64);
  ASSERT_TRUE(dev->BeginCapture().ok());
  dev->CopyToHost(a->data<float>(), host.data(), sizeof(float) * 64);  // waits on the stream
  auto graph = dev->EndCapture();
  EXPECT_FALSE(graph.ok());
}

}  // namespace
}  // namespace iris::kernels
