// Where and how an operation runs.
#pragma once

#include <cstddef>

#include "dsa/status.hpp"

namespace dsa {

enum class Backend {
  // CUDA when the tensors live on a CUDA device (the Hopper kernels on sm_90
  // devices for the shapes they serve, the generic kernels otherwise); the
  // multithreaded CPU backend when they live in host memory.
  automatic,
  cpu_reference,  // straightforward single-threaded loops; the semantic reference
  cpu,            // multithreaded CPU path: keys scored in SIMD blocks, with fused
                  // multiply-adds where the processor has them
  cuda_generic,   // CUDA kernels that run on any GPU the toolkit supports
  cuda_hopper,    // sm_90a kernels (wgmma, bulk copies); CUDA only on compute capability 9.0
};

const char* backend_name(Backend backend) noexcept;

// Caller-owned scratch memory, on the same device as the operation's tensors.
// Each operation has a *_workspace_bytes() query; CUDA operations need at
// least that much (they keep a device-side error record at its start), CPU
// operations accept an empty workspace.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// The most worker threads ExecContext::num_threads may ask for.
inline constexpr int kMaxCpuThreads = 1024;

// Alignment every workspace pointer must have.
inline constexpr std::size_t kWorkspaceAlignment = 256;

struct ExecContext {
  Backend backend = Backend::automatic;
  // cudaStream_t for the CUDA backends (nullptr: the legacy default stream).
  // CUDA operations are stream-ordered: they enqueue work and return without
  // synchronizing, allocate nothing and are CUDA-graph capturable.
  void* stream = nullptr;
  Workspace workspace{};
  // CPU backend: worker threads, 0 to kMaxCpuThreads (0: the hardware
  // concurrency). Threads the system cannot start leave their share to the
  // calling thread; the result does not depend on the count.
  int num_threads = 0;
  // cpu_reference: accumulate dot products and sums in float64 (the result is
  // still rounded once to the output dtype).
  bool reference_float64 = false;
  // CUDA: data-dependent rules (a length beyond the block table, a page index
  // out of range, a slot beyond the cache) can only be checked on the device.
  // Kernels always refuse the bad access (no out-of-bounds read or write; the
  // affected output rows are filled with NaN, or -1 for indices) and record the
  // first violation in the workspace. With this flag the operation synchronizes
  // the stream at its end and returns that violation as its Status; without
  // it, read_device_error() reports it later. Not allowed during graph capture.
  bool check_device_errors = false;
  // CUDA: launch every kernel with programmatic dependent launch (compute
  // capability 9.0 and newer). A kernel may then start while the kernel
  // before it on ctx.stream (the operation's own or whatever was enqueued
  // before the call) is finishing: its launch, the placement of its CTAs and
  // a prologue that reads no input (barrier setup) overlap that kernel's
  // tail, and it waits on the device for that kernel to complete before it
  // reads an input or writes an output. Results are bitwise identical with
  // and without it, and each operation still clears the error record before
  // its kernels record anything. Launches are CUDA-graph capturable either
  // way (captured, the overlap becomes a programmatic edge between kernel
  // nodes). The overlap spans kernels only: a copy, memset or event between
  // two kernels serializes them as usual. Where a device or the kernel code
  // loaded for it (PTX compiled for an older target) lacks the device-side
  // wait, the kernel is launched without the overlap.
  bool programmatic_dependent_launch = false;
};

// Synchronizes ctx.stream and returns the first data-dependent error the last
// CUDA operation that used this workspace recorded (ok when none). Each CUDA
// operation clears the record when it starts. For CPU contexts, returns ok.
Status read_device_error(const ExecContext& ctx);

}  // namespace dsa
