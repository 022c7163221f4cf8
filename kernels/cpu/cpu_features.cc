#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace iris::kernels::cpu {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs CpuId(unsigned leaf, unsigned subleaf) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) return Regs{};
  return r;
}

bool Bit(unsigned v, int bit) { return (v >> bit) & 1u; }

// XCR0: which register states the OS saves on a context switch.
uint64_t Xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures Detect() {
  CpuFeatures f;
  const Regs l1 = CpuId(1, 0);
  const bool osxsave = Bit(l1.c, 27);
  const uint64_t xcr0 = osxsave ? Xcr0() : 0;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;              // SSE + AVX
  const bool zmm_state = ymm_state && (xcr0 & 0xE0) == 0xE0;  // opmask + upper zmm
  const bool tile_state = (xcr0 & (3ull << 17)) == (3ull << 17);
  const Regs l7 = CpuId(7, 0);
  const Regs l71 = CpuId(7, 1);
  f.avx2 = ymm_state && Bit(l1.c, 28) && Bit(l1.c, 12) && Bit(l7.b, 5);  // AVX, FMA, AVX2
  f.avx512 = f.avx2 && zmm_state && Bit(l7.b, 16) && Bit(l7.b, 17) && Bit(l7.b, 30) && Bit(l7.b, 31);  // F DQ BW VL
  f.avx512_bf16 = f.avx512 && Bit(l71.a, 5);
  f.amx = tile_state && Bit(l7.d, 24) && Bit(l7.d, 22);  // AMX-TILE, AMX-BF16
  char brand[49] = {};
  if (CpuId(0x80000000u, 0).a >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = CpuId(0x80000002u + i, 0);
      std::memcpy(brand + 16 * i, &r, 16);
    }
  }
  std::string b(brand);
  b.erase(0, b.find_first_not_of(' '));
  f.brand = b.empty() ? "unknown x86-64" : b;
  return f;
}

}  // namespace

CpuIsa CpuFeatures::best() const {
  if (avx512_bf16) return CpuIsa::kAvx512Bf16;
  if (avx512) return CpuIsa::kAvx512;
  return CpuIsa::kAvx2;
}

const CpuFeatures& DetectCpuFeatures() {
  static const CpuFeatures* features = new CpuFeatures(Detect());
  return *features;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512_bf16";
  }
  return "?";
}

absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cpu isa \"", std::string(name), "\" is not one of avx2, avx512, avx512_bf16"));
}

absl::StatusOr<CpuIsa> ChooseCpuIsa(std::string_view requested) {
  const CpuFeatures& f = DetectCpuFeatures();
  if (!f.avx2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this processor (", f.brand, ") lacks AVX2 and FMA, the least iris's kernels are built for"));
  }
  std::string_view want = requested;
  if (want.empty()) {
    const char* env = std::getenv("IRIS_CPU_ISA");
    if (env != nullptr) want = env;
  }
  if (want.empty()) return f.best();
  absl::StatusOr<CpuIsa> cap = ParseCpuIsa(want);
  if (!cap.ok()) return cap.status();
  return std::min(*cap, f.best());
}

}  // namespace iris::kernels::cpu
