// The device side of programmatic dependent launch
// (ExecContext::programmatic_dependent_launch, launch_kernel in
// launch_utils.hpp): CUDA's builtins for griddepcontrol.wait and
// griddepcontrol.launch_dependents, compiled to nothing below compute
// capability 9.0 (launch_kernel never asks for the overlap there).
#pragma once

#include <cuda_runtime.h>

namespace dsa::detail::cuda {

// Blocks the calling thread until the kernel launched before this one on the
// stream has completed and its memory writes are visible. Returns at once
// where this grid was launched without the overlap (it then started after
// that kernel completed).
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

// Lets the next kernel on the stream start once every CTA of this grid has
// called this or exited. It gives that kernel nothing to read early: its own
// wait_for_prior_grids() still waits for this grid's completion.
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// Every kernel of the CUDA backend calls this in all of its threads, on every
// path, before its first read of memory an earlier kernel may write and its
// first write: only a prologue that reads none (barrier setup, tensor-map
// prefetch, shared-memory carving) comes before it. Since every thread
// waits, a grid completes only after the grid before it, so a kernel that
// waits for its predecessor alone sees everything enqueued before. Letting
// the next kernel start this early costs nothing: it waits on the device in
// turn, and it starts only once every CTA of this grid has been scheduled.
__device__ __forceinline__ void enter_dependent_grid() {
  wait_for_prior_grids();
  allow_dependent_grids();
}

}  // namespace dsa::detail::cuda
