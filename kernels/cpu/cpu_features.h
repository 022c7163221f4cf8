// What the processor can run, read once with cpuid (and xgetbv: the OS must save the wide
// registers), so that one binary built for the x86-64 baseline with AVX2 picks its AVX-512 and
// AVX512-BF16 kernels at run time. AMX is oneDNN's business; it is reported for logs.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace iris::kernels::cpu {

// The tiers iris's own kernels are written for, in increasing order.
enum class CpuIsa {
  kAvx2,        // AVX2 + FMA: the portable kernels (plain C++ the compiler vectorises)
  kAvx512,      // AVX-512 F/BW/VL/DQ: the hand-written kernels, bf16 rounding done in software
  kAvx512Bf16,  // + AVX512-BF16: bf16 dot products in attention, hardware rounding
};

struct CpuFeatures {
  std::string brand;  // "Intel(R) Xeon(R) Platinum 8480+", from cpuid
  bool avx2 = false;  // with FMA
  bool avx512 = false;
  bool avx512_bf16 = false;
  bool amx = false;   // AMX-TILE and AMX-BF16 (used by oneDNN's matmuls)
  CpuIsa best() const;
};

const CpuFeatures& DetectCpuFeatures();

const char* CpuIsaName(CpuIsa isa);  // "avx2", "avx512", "avx512_bf16"
// Parses a name as CpuIsaName writes it. INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name);

// The tier to run: `requested` (or the IRIS_CPU_ISA environment variable when empty, like
// oneDNN's ONEDNN_MAX_CPU_ISA) as a cap on what the processor has. INVALID_ARGUMENT for an
// unknown name; FAILED_PRECONDITION on a processor without AVX2 (the build's baseline).
absl::StatusOr<CpuIsa> ChooseCpuIsa(std::string_view requested);

}  // namespace iris::kernels::cpu
