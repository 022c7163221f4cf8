// The CPU tier choice: tier names, the best tier of a feature set, ChooseCpuIsa's cap (the
// request, else IRIS_CPU_ISA, never above what the processor has) and the device it builds.
#include "kernels/cpu/cpu_features.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/device.h"

namespace iris::kernels::cpu {
namespace {

constexpr CpuIsa kAll[] = {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16};

// Sets IRIS_CPU_ISA for one test (unset for nullptr) and restores it after.
class ScopedIsaEnv {
 public:
  explicit ScopedIsaEnv(const char* value) {
    if (const char* old = std::getenv("IRIS_CPU_ISA")) {
      saved_ = old;
      had_ = true;
    }
    if (value != nullptr) {
      setenv("IRIS_CPU_ISA", value, 1);
    } else {
      unsetenv("IRIS_CPU_ISA");
    }
  }
  ~ScopedIsaEnv() {
    if (had_) {
      setenv("IRIS_CPU_ISA", saved_.c_str(), 1);
    } else {
      unsetenv("IRIS_CPU_ISA");
    }
  }

 private:
  std::string saved_;
  bool had_ = false;
};

TEST(CpuFeaturesTest, NamesRoundTrip) {
  for (CpuIsa isa : kAll) {
    absl::StatusOr<CpuIsa> parsed = ParseCpuIsa(CpuIsaName(isa));
    ASSERT_TRUE(parsed.ok()) << CpuIsaName(isa);
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_STREQ(CpuIsaName(CpuIsa::kAvx512Bf16), "avx512_bf16");
}

TEST(CpuFeaturesTest, RejectsUnknownNames) {
  for (const char* bad : {"", "AVX2", "avx512bf16", "amx", "avx2 "}) {
    absl::StatusOr<CpuIsa> parsed = ParseCpuIsa(bad);
    ASSERT_FALSE(parsed.ok()) << '"' << bad << '"';
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("avx2, avx512, avx512_bf16"), std::string::npos);
  }
}

TEST(CpuFeaturesTest, BestTierOfAFeatureSet) {
  CpuFeatures f;
  f.avx2 = true;
  EXPECT_EQ(f.best(), CpuIsa::kAvx2);
  f.avx512 = true;
  EXPECT_EQ(f.best(), CpuIsa::kAvx512);
  f.avx512_bf16 = true;
  EXPECT_EQ(f.best(), CpuIsa::kAvx512Bf16);
  f.amx = true;  // oneDNN's business: no tier of its own
  EXPECT_EQ(f.best(), CpuIsa::kAvx512Bf16);
}

// Prints what this processor has. With IRIS_EXPECT_CPU_ISA set (scripts/portable_check.sh under
// an emulated processor) the detected tier must be that one.
TEST(CpuFeaturesTest, DetectsThisProcessor) {
  const CpuFeatures& f = DetectCpuFeatures();
  std::printf("cpu: %s; avx2 %d avx512 %d avx512_bf16 %d amx %d; best tier %s\n", f.brand.c_str(), f.avx2, f.avx512,
              f.avx512_bf16, f.amx, CpuIsaName(f.best()));
  EXPECT_FALSE(f.brand.empty());
  EXPECT_TRUE(f.avx2) << "the build's baseline";
  EXPECT_TRUE(f.avx512 || !f.avx512_bf16);
  EXPECT_TRUE(f.avx2 || !f.avx512);
  if (const char* want = std::getenv("IRIS_EXPECT_CPU_ISA")) {
    EXPECT_STREQ(CpuIsaName(f.best()), want);
  }
}

TEST(CpuFeaturesTest, RequestCapsTheTier) {
  const ScopedIsaEnv env(nullptr);
  const CpuIsa best = DetectCpuFeatures().best();
  for (CpuIsa cap : kAll) {
    absl::StatusOr<CpuIsa> isa = ChooseCpuIsa(CpuIsaName(cap));
    ASSERT_TRUE(isa.ok()) << isa.status();
    EXPECT_EQ(*isa, std::min(cap, best)) << "cap " << CpuIsaName(cap);  // never above the processor
  }
  absl::StatusOr<CpuIsa> none = ChooseCpuIsa("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, best);
  EXPECT_EQ(ChooseCpuIsa("avx1024").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuFeaturesTest, EnvironmentCapsWhenNothingIsRequested) {
  {
    const ScopedIsaEnv env("avx2");
    absl::StatusOr<CpuIsa> isa = ChooseCpuIsa("");
    ASSERT_TRUE(isa.ok());
    EXPECT_EQ(*isa, CpuIsa::kAvx2);
    // An explicit request wins over the environment.
    absl::StatusOr<CpuIsa> requested = ChooseCpuIsa("avx512_bf16");
    ASSERT_TRUE(requested.ok());
    EXPECT_EQ(*requested, DetectCpuFeatures().best());
  }
  {
    const ScopedIsaEnv env("avx512");
    absl::StatusOr<CpuIsa> isa = ChooseCpuIsa("");
    ASSERT_TRUE(isa.ok());
    EXPECT_EQ(*isa, std::min(CpuIsa::kAvx512, DetectCpuFeatures().best()));
  }
  {
    const ScopedIsaEnv env("sse2");
    EXPECT_EQ(ChooseCpuIsa("").status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(CpuFeaturesTest, DeviceRunsTheChosenTier) {
  const ScopedIsaEnv env(nullptr);
  DeviceOptions options;
  options.threads = 1;
  options.cpu_isa = "avx2";
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(options);
  ASSERT_TRUE(device.ok()) << device.status();
  CpuDevice& cpu = AsCpu(**device);
  EXPECT_EQ(cpu.isa(), CpuIsa::kAvx2);
  EXPECT_FALSE(cpu.native_bf16());
  EXPECT_NE((*device)->Describe().find("kernels avx2"), std::string::npos) << (*device)->Describe();

  options.cpu_isa = "avx512_bf16";
  device = CreateDevice(options);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(AsCpu(**device).isa(), DetectCpuFeatures().best());
  EXPECT_EQ(AsCpu(**device).native_bf16(), DetectCpuFeatures().avx512_bf16);

  options.cpu_isa = "avx3";
  EXPECT_EQ(CreateDevice(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.cpu_isa = "";

  // The GPU's choices of kernel (the encoder's attention, the paged attention's, the decode
  // rotary's place): the CPU takes the defaults only (named or empty), refuses the others as a
  // GPU's, and names the choices for an unknown one.
  const auto check_choice = [&](std::string DeviceOptions::*field, std::vector<const char*> ok,
                                std::vector<std::pair<const char*, const char*>> refused) {
    for (const char* name : ok) {
      options.*field = name;
      EXPECT_TRUE(CreateDevice(options).ok()) << name;
    }
    for (const auto& [name, message] : refused) {
      options.*field = name;
      const absl::Status st = CreateDevice(options).status();
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << name;
      EXPECT_NE(st.message().find(message), std::string::npos) << st;
    }
    options.*field = "";
  };
  check_choice(&DeviceOptions::attention, {"", "flash"},
               {{"cudnn", "is for a CUDA device"}, {"sdpa", "not one of: flash, cudnn"}});
  check_choice(&DeviceOptions::prefill_attention, {"", "tensor-cores"},
               {{"cuda-cores", "is for a CUDA device"}, {"mma", "not one of: tensor-cores, cuda-cores"}});
  check_choice(&DeviceOptions::decode_attention, {"", "cuda-cores"},
               {{"tensor-cores", "is for a CUDA device"},
                {"tensor-cores-every-batch", "is for a CUDA device"},
                {"packed", "not one of: cuda-cores, tensor-cores, tensor-cores-every-batch"}});
  check_choice(&DeviceOptions::decode_rotary, {"", "separate"},
               {{"fused", "is for a CUDA device"},
                {"gemv", "is for a CUDA device"},
                {"inline", "not one of: separate, fused, gemv"}});
  check_choice(&DeviceOptions::hopper_gemm, {"", "off"},
               {{"swiglu", "is for a CUDA device"}, {"all", "is for a CUDA device"}, {"on", "not one of: off, swiglu, all"}});
  // cuBLASLt's matmul tuning: the CPU's oneDNN has no such choice to make.
  options.matmul_tuning = true;
  const absl::Status t = CreateDevice(options).status();
  EXPECT_EQ(t.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.message().find("matmul tuning is for a CUDA device"), std::string::npos) << t;
  options.matmul_tuning = false;
  EXPECT_TRUE(CreateDevice(options).ok());
}

}  // namespace
}  // namespace iris::kernels::cpu
