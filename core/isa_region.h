// A region of a source file compiled for AVX-512 in a build whose baseline is lower (x86-64-v3):
// the functions defined between IRIS_AVX512_BEGIN and IRIS_AVX512_END get the target attribute
// (F/BW/VL/DQ + BF16: the kernels, picked at run time by kernels/<op>.cc from CpuDevice::isa()),
// and those between IRIS_AVX512_VBMI_BEGIN and IRIS_AVX512_VBMI_END get F/BW/VL/DQ + VBMI (image
// preprocessing, picked by core::HostHasAvx512Vbmi()). One binary carries every tier; only
// functions defined inside a region run its code. The two feature sets stay apart so that neither
// lets the compiler emit an instruction the other's run-time check did not ask for.
//
// Rules for a region:
//  - It opens after every #include: a std or absl header parsed inside would compile its inline
//    functions for AVX-512, and the linker may keep that copy for baseline callers (SIGILL on an
//    AVX2 machine).
//  - A function in it may only be called when the device's tier allows it; BF16 instructions
//    (vdpbf16ps, vcvtne2ps2bf16) only when the tier is kAvx512Bf16.
//  - The body of an OpenMP construct holds no vector values: clang-14 outlines it into a function
//    without the region's target (GCC keeps it), so it must call region functions instead.
#pragma once

#if defined(__clang__)
#define IRIS_AVX512_BEGIN                                                                               \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,bmi2\"))), apply_to = function)")
#define IRIS_AVX512_END _Pragma("clang attribute pop")
#define IRIS_AVX512_VBMI_BEGIN                                                                          \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,fma,f16c,bmi2\"))), apply_to = function)")
#define IRIS_AVX512_VBMI_END _Pragma("clang attribute pop")
#elif defined(__GNUC__)
// -Wpsabi: GCC warns that a lambda returning a zmm value changes the ABI, although the lambda does
// get the region's target.
#define IRIS_AVX512_BEGIN                                                                    \
  _Pragma("GCC push_options")                                                                \
  _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,bmi2\")")     \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#define IRIS_AVX512_END _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#define IRIS_AVX512_VBMI_BEGIN                                                               \
  _Pragma("GCC push_options")                                                                \
  _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,fma,f16c,bmi2\")")     \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#define IRIS_AVX512_VBMI_END _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#else
#error "iris's AVX-512 kernels need GCC or clang"
#endif
