// Instruction-set variants of the hot CPU functions, chosen when the program
// runs, so that one x86-64 build uses the wider vectors where they exist.
// DSA_CPU_CLONES marks a function that GCC compiles twice on x86-64, for the
// baseline instruction set and for x86-64-v3 (AVX2, FMA); the loader picks
// the clone the processor runs. DSA_CPU_X86_VARIANTS is 1 where functions
// written for further instruction sets (AVX-512 BF16) are compiled too.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSA_CPU_X86_VARIANTS 1
#define DSA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DSA_CPU_X86_VARIANTS 0
#define DSA_CPU_CLONES
#endif
