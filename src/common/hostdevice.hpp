// Lets small inline helpers compile for both the host and CUDA devices.
#pragma once

#if defined(__CUDACC__)
#define DSA_HD __host__ __device__ __forceinline__
#else
#define DSA_HD inline
#endif
