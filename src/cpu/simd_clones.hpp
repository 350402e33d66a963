// DSA_CPU_CLONES marks a hot CPU function to be compiled twice on x86-64
// with GCC: for the baseline instruction set and for x86-64-v3 (AVX2, FMA).
// The loader picks the clone the processor runs, so one build serves every
// x86-64 machine and uses the wider vectors where they exist.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DSA_CPU_CLONES
#endif
