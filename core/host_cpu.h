// What the host processor can run, for host code with wide-vector paths outside the kernels
// (image preprocessing). The kernels have their own tiers on the CPU device (kernels/cpu).
#pragma once

namespace iris::core {

// AVX-512 F/BW/VL/DQ and VBMI, saved by the OS, and not capped by IRIS_CPU_ISA=avx2 (the
// variable that also caps the kernels: a run with it set exercises the portable paths).
bool HostHasAvx512Vbmi();

}  // namespace iris::core
