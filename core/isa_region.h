// Code for a wider instruction set inside a binary built for the x86-64-v3 baseline (AVX2, FMA).
// Function definitions between IRIS_AVX512_BEGIN and IRIS_AVX512_END get the AVX-512 target; put
// the pair after every #include, so that inline functions and templates from library headers keep
// the baseline (compiled into such a file with -mavx512f instead, they would be weak symbols the
// linker may pick for baseline callers: SIGILL on an AVX2 processor). Code in the region runs only
// after a run-time check that the processor has these features.
#pragma once

// The target: AVX-512 F/BW/VL/DQ, VBMI (byte permutes) and BF16, with the AVX2-era extensions.
#if defined(__clang__)
#define IRIS_AVX512_BEGIN                                                                           \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512bf16,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt\"))), apply_to = function)")
#define IRIS_AVX512_END _Pragma("clang attribute pop")
#else
#define IRIS_AVX512_BEGIN \
  _Pragma("GCC push_options") \
  _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512bf16,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt\")")
#define IRIS_AVX512_END _Pragma("GCC pop_options")
#endif
