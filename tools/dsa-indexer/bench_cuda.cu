// CUDA side of the tool's measurements (see device_timing.hpp).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda/ptx>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "cuda/hopper/ptx.cuh"
#include "device_timing.hpp"
#include "dsa/device.hpp"
#include "timing.hpp"

namespace dsa_cli {
namespace {

dsa::Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return {};
  return {dsa::ErrorCode::cuda_error, std::string(what) + ": " + cudaGetErrorString(error)};
}

dsa::Status cublas_status(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return {};
  return {dsa::ErrorCode::cuda_error,
          std::string(what) + ": cuBLASLt status " + std::to_string(static_cast<int>(status))};
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  dsa::Status create() { return cuda_status(cudaEventCreate(&event_), "cudaEventCreate"); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Device-side wait for the host: the kernel spins until the host has
// written `ticket` to pinned, mapped memory, or until kHoldLimitNs have passed.
constexpr unsigned long long kHoldLimitNs = 5'000'000;

__global__ void hold_stream_kernel(const volatile unsigned* released, unsigned ticket) {
  const unsigned long long start = cuda::ptx::get_sreg_globaltimer();
  while (*released < ticket && cuda::ptx::get_sreg_globaltimer() - start < kHoldLimitNs) __nanosleep(500);
}

// Holds a stream at a point until the host releases it (see time_device_runs).
class StreamGate {
 public:
  StreamGate() = default;
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  ~StreamGate() {
    if (released_ != nullptr) cudaFreeHost(const_cast<unsigned*>(released_));
  }
  dsa::Status create() {
    unsigned* memory = nullptr;
    DSA_RETURN_IF_ERROR(cuda_status(cudaHostAlloc(&memory, sizeof(unsigned), cudaHostAllocMapped), "cudaHostAlloc"));
    released_ = memory;
    *released_ = 0;
    return cuda_status(cudaHostGetDevicePointer(&device_view_, memory, 0), "cudaHostGetDevicePointer");
  }
  dsa::Status hold(void* stream, unsigned ticket) const {
    hold_stream_kernel<<<1, 1, 0, as_stream(stream)>>>(device_view_, ticket);
    return cuda_status(cudaGetLastError(), "hold_stream_kernel");
  }
  void release(unsigned ticket) { *released_ = ticket; }

 private:
  volatile unsigned* released_ = nullptr;
  unsigned* device_view_ = nullptr;
};

dsa::Status allocate_on_current_device(std::size_t bytes, dsa::DeviceBuffer* buffer) {
  int device = 0;
  DSA_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  return dsa::DeviceBuffer::allocate(bytes, device, buffer);
}

// splitmix64 finalizer: a counter-based generator, one value per index.
__device__ __forceinline__ unsigned long long mix(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float unit_uniform(unsigned long long bits) {
  return static_cast<float>(bits >> 40) * 0x1.0p-24f;  // [0, 1)
}

__device__ __forceinline__ float roughly_normal(unsigned long long bits) {
  const float sum = static_cast<float>(bits & 0xFFFF) + static_cast<float>((bits >> 16) & 0xFFFF) +
                    static_cast<float>((bits >> 32) & 0xFFFF) + static_cast<float>(bits >> 48);
  return (sum - 4 * 32767.5f) * (1.0f / 37837.2f);
}

__global__ void fill_bf16_kernel(__nv_bfloat16* dst, std::size_t count, std::size_t row_length,
                                 unsigned long long seed) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    const unsigned long long row = i / row_length;
    const float gain = exp2f(unit_uniform(mix(seed ^ (row * 0xD1B54A32D192ED03ull) ^ 1)) * 4.0f - 2.0f);
    dst[i] = __float2bfloat16_rn(gain * roughly_normal(mix(seed + i)));
  }
}

// Random e4m3 bytes with exponent field < 8 (no NaN, magnitudes below 2).
__global__ void fill_fp8_kernel(unsigned char* dst, std::size_t count, unsigned long long seed) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    const unsigned long long bits = mix(seed + i);
    dst[i] = static_cast<unsigned char>((bits & 0x80) | ((bits >> 8) & 0x3F));
  }
}

__global__ void fill_logits_kernel(float* dst, std::size_t count, int distribution,
                                   unsigned long long seed) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    const float u = unit_uniform(mix(seed + i));
    float value = 1.0f;
    switch (static_cast<LogitsDistribution>(distribution)) {
      case LogitsDistribution::uniform: value = 2.0f * u - 1.0f; break;
      case LogitsDistribution::concentrated: value = 1.0f + u * 0x1.0p-8f; break;
      case LogitsDistribution::tied: value = floorf(u * 8.0f) * 0.125f; break;
      case LogitsDistribution::constant: value = 1.0f; break;
    }
    dst[i] = value;
  }
}

constexpr int kFillThreads = 256;

constexpr int kGatherThreads = 256;

// Block b copies page table_row[b] of the request: its tokens' codes (one
// contiguous run both in the page and in `codes`), then their scales, 16
// bytes at a time; the last page may hold fewer than P of the request's
// tokens, whose scales past a whole vector go word by word.
__global__ void __launch_bounds__(kGatherThreads)
    gather_pages_kernel(const unsigned char* cache, std::int64_t page_bytes, const std::int32_t* table_row,
                        std::int64_t tokens, int page_tokens, int code_bytes, unsigned char* codes,
                        unsigned char* scales) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * page_tokens;
  const int count = static_cast<int>(min(static_cast<std::int64_t>(page_tokens), tokens - first));
  const unsigned char* page = cache + static_cast<std::int64_t>(table_row[blockIdx.x]) * page_bytes;
  const auto* key_src = reinterpret_cast<const uint4*>(page);
  auto* key_dst = reinterpret_cast<uint4*>(codes + first * code_bytes);
  const int key_vectors = count * code_bytes / 16;
  for (int i = static_cast<int>(threadIdx.x); i < key_vectors; i += kGatherThreads) key_dst[i] = key_src[i];
  const unsigned char* page_scales = page + static_cast<std::int64_t>(page_tokens) * code_bytes;
  unsigned char* scale_dst = scales + first * 4;
  const int scale_vectors = count / 4;
  for (int i = static_cast<int>(threadIdx.x); i < scale_vectors; i += kGatherThreads) {
    reinterpret_cast<uint4*>(scale_dst)[i] = reinterpret_cast<const uint4*>(page_scales)[i];
  }
  for (int t = 4 * scale_vectors + static_cast<int>(threadIdx.x); t < count; t += kGatherThreads) {
    reinterpret_cast<std::uint32_t*>(scale_dst)[t] = reinterpret_cast<const std::uint32_t*>(page_scales)[t];
  }
}

unsigned fill_blocks(std::size_t count) {
  const std::size_t blocks = (count + kFillThreads - 1) / kFillThreads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, 65536));
}

// cuBLASLt objects of one matrix product, released in reverse order.
struct MatmulObjects {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;

  MatmulObjects() = default;
  MatmulObjects(const MatmulObjects&) = delete;
  MatmulObjects& operator=(const MatmulObjects&) = delete;
  ~MatmulObjects() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

// Sets up D = A^T B for fp8 A, B (the "TN" layout fp8 products require) with
// the given output type; *found is false when cuBLASLt has no algorithm.
dsa::Status plan_fp8_matmul(int size, cudaDataType_t output_type, std::size_t workspace_bytes,
                            MatmulObjects* objects, cublasLtMatmulHeuristicResult_t* heuristic,
                            bool* found) {
  const auto n = static_cast<std::uint64_t>(size);
  DSA_RETURN_IF_ERROR(cublas_status(cublasLtCreate(&objects->handle), "cublasLtCreate"));
  DSA_RETURN_IF_ERROR(cublas_status(
      cublasLtMatmulDescCreate(&objects->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  DSA_RETURN_IF_ERROR(cublas_status(cublasLtMatmulDescSetAttribute(objects->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                                   &transpose, sizeof transpose),
                                    "cublasLtMatmulDescSetAttribute(TRANSA)"));
  DSA_RETURN_IF_ERROR(cublas_status(
      cublasLtMatmulDescSetAttribute(objects->desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep),
      "cublasLtMatmulDescSetAttribute(TRANSB)"));
  DSA_RETURN_IF_ERROR(cublas_status(cublasLtMatrixLayoutCreate(&objects->a, CUDA_R_8F_E4M3, n, n, n),
                                    "cublasLtMatrixLayoutCreate(A)"));
  DSA_RETURN_IF_ERROR(cublas_status(cublasLtMatrixLayoutCreate(&objects->b, CUDA_R_8F_E4M3, n, n, n),
                                    "cublasLtMatrixLayoutCreate(B)"));
  DSA_RETURN_IF_ERROR(cublas_status(cublasLtMatrixLayoutCreate(&objects->d, output_type, n, n, n),
                                    "cublasLtMatrixLayoutCreate(D)"));
  DSA_RETURN_IF_ERROR(cublas_status(cublasLtMatmulPreferenceCreate(&objects->preference),
                                    "cublasLtMatmulPreferenceCreate"));
  DSA_RETURN_IF_ERROR(cublas_status(
      cublasLtMatmulPreferenceSetAttribute(objects->preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof workspace_bytes),
      "cublasLtMatmulPreferenceSetAttribute"));
  int results = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(objects->handle, objects->desc, objects->a, objects->b, objects->d,
                                     objects->d, objects->preference, 1, heuristic, &results);
  *found = status == CUBLAS_STATUS_SUCCESS && results > 0;
  return {};
}


// ---- the fp8 tensor-core rate (sm_90a) ------------------------------------

namespace ptx = dsa::detail::cuda::hopper::ptx;

constexpr int kPeakWarpgroups = 2;  // per CTA, sharing the operand tiles
constexpr int kPeakThreads = 128 * kPeakWarpgroups;
constexpr int kPeakSteps = 1024;    // per warpgroup: kPeakSlices products each
constexpr int kPeakSlices = 4;      // the k32 slices of a 128-byte operand row
constexpr int kPeakRowBytes = 128;  // K-major rows with the 128-byte swizzle

// The operand tiles, A [64 x 128 B] then B [N x 128 B], from a 1024-byte
// aligned base (the swizzle's alignment), plus the slack to align it.
template <int N>
constexpr int peak_shared_bytes() {
  return 1024 + (64 + N) * kPeakRowBytes;
}

// Every warpgroup multiplies the same shared tiles into its own accumulators,
// kPeakSteps * kPeakSlices products of 2 * 64 * N * 32 FLOPs each, keeping one
// commit group in flight while it issues the next. The tiles hold random
// e4m3 bytes (finite, magnitudes below 2): tensor-core power, and so the
// clock, depends on the data, and zeros would flatter the rate. Each thread
// stores the sum of its accumulators so no product is dead code, and the
// first thread marks that the sm_90a body ran (the generic PTX target of the
// same kernel has an empty body).
template <int N>
__global__ void __launch_bounds__(kPeakThreads) fp8_peak_kernel(float* sink, int* executed) {
#if DSA_SM90A_ENABLED
  extern __shared__ unsigned char shared_raw[];
  unsigned char* tiles = shared_raw + ((1024 - (ptx::smem_address(shared_raw) & 1023)) & 1023);
  constexpr int kTileBytes = (64 + N) * kPeakRowBytes;
  for (int i = static_cast<int>(threadIdx.x); i < kTileBytes; i += kPeakThreads) {
    const unsigned long long bits = mix((static_cast<unsigned long long>(blockIdx.x) << 32) ^ i);
    tiles[i] = static_cast<unsigned char>((bits & 0x80) | ((bits >> 8) & 0x3F));
  }
  ptx::fence_proxy_async_shared();  // the generic-proxy writes, before wgmma reads them
  __syncthreads();
  const std::uint32_t a = ptx::k_major_swizzle128_descriptor_low(tiles);
  const std::uint32_t b = ptx::k_major_swizzle128_descriptor_low(tiles + 64 * kPeakRowBytes);
  float d[N / 2];
  for (float& value : d) value = 0.0f;
  ptx::wgmma_fence();
  for (int step = 0; step < kPeakSteps; ++step) {
#pragma unroll
    for (int k = 0; k < kPeakSlices; ++k) {
      // Descriptor addresses count 16-byte units: a k32 slice is 2 of them.
      ptx::WgmmaFp8<N>::mma(d, ptx::swizzle128_descriptor(a + 2 * k), ptx::swizzle128_descriptor(b + 2 * k),
                             true);
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();
  }
  ptx::wgmma_wait<0>();
  float sum = 0.0f;
  for (float& value : d) {
    ptx::fence_operand(value);
    sum += value;
  }
  sink[static_cast<std::size_t>(blockIdx.x) * kPeakThreads + threadIdx.x] = sum;
  if (blockIdx.x == 0 && threadIdx.x == 0) *executed = 1;
#else
  (void)sink;
  (void)executed;
#endif
}

// Times fp8_peak_kernel<N> on every multiprocessor, filled to its occupancy.
template <int N>
dsa::Status time_fp8_peak(void* stream, int iters, int multiprocessors, double* flops_per_second,
                          int* ctas, int* warpgroups_per_sm) {
  constexpr int kSharedBytes = peak_shared_bytes<N>();
  static_assert(kSharedBytes <= 48 * 1024, "the tiles fit the default dynamic shared memory limit");
  int per_sm = 0;
  DSA_RETURN_IF_ERROR(cuda_status(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fp8_peak_kernel<N>, kPeakThreads, kSharedBytes),
      "cudaOccupancyMaxActiveBlocksPerMultiprocessor"));
  if (per_sm < 1) return {dsa::ErrorCode::unsupported, "the fp8 rate kernel does not fit a multiprocessor"};
  const int blocks = per_sm * multiprocessors;
  dsa::DeviceBuffer sink, executed;
  DSA_RETURN_IF_ERROR(
      allocate_on_current_device(static_cast<std::size_t>(blocks) * kPeakThreads * sizeof(float), &sink));
  DSA_RETURN_IF_ERROR(allocate_on_current_device(sizeof(int), &executed));
  DSA_RETURN_IF_ERROR(executed.fill_bytes(0));
  RunTimes times;
  DSA_RETURN_IF_ERROR(time_device_runs(stream, 3, iters, [&](int) {
    fp8_peak_kernel<N><<<blocks, kPeakThreads, kSharedBytes, as_stream(stream)>>>(
        static_cast<float*>(sink.data()), static_cast<int*>(executed.data()));
    return cuda_status(cudaGetLastError(), "fp8_peak_kernel");
  }, &times));
  int ran = 0;
  DSA_RETURN_IF_ERROR(executed.copy_to_host(&ran, sizeof ran));
  if (ran != 1) {
    return {dsa::ErrorCode::unsupported, "the tool was built without sm_90a code (see DSA_CUDA_GENCODE)"};
  }
  const double flops = 2.0 * 64 * N * 32 * kPeakSlices * static_cast<double>(kPeakSteps) * kPeakWarpgroups * blocks;
  *flops_per_second = flops / median(times.elapsed);
  *ctas = blocks;
  *warpgroups_per_sm = per_sm * kPeakWarpgroups;
  return {};
}
}  // namespace

dsa::Status time_device_runs(void* stream, int warmup, int iters,
                             const std::function<dsa::Status(int run)>& launch, RunTimes* times) {
  const int total = warmup + iters;
  std::vector<Event> starts(static_cast<std::size_t>(iters));
  std::vector<Event> ends(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    DSA_RETURN_IF_ERROR(starts[static_cast<std::size_t>(i)].create());
    DSA_RETURN_IF_ERROR(ends[static_cast<std::size_t>(i)].create());
  }
  StreamGate gate;
  DSA_RETURN_IF_ERROR(gate.create());
  times->host.clear();
  for (int run = 0; run < total; ++run) {
    const int timed = run - warmup;
    DSA_RETURN_IF_ERROR(gate.hold(stream, static_cast<unsigned>(run) + 1));
    if (timed >= 0) {
      DSA_RETURN_IF_ERROR(cuda_status(
          cudaEventRecord(starts[static_cast<std::size_t>(timed)].get(), as_stream(stream)), "cudaEventRecord"));
    }
    const auto host_start = std::chrono::steady_clock::now();
    const dsa::Status launched = launch(run);
    const std::chrono::duration<double> host_time = std::chrono::steady_clock::now() - host_start;
    if (timed >= 0) {
      times->host.push_back(host_time.count());
      if (launched.ok()) {
        DSA_RETURN_IF_ERROR(cuda_status(
            cudaEventRecord(ends[static_cast<std::size_t>(timed)].get(), as_stream(stream)), "cudaEventRecord"));
      }
    }
    gate.release(static_cast<unsigned>(run) + 1);
    DSA_RETURN_IF_ERROR(launched);
  }
  DSA_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize"));
  times->elapsed.assign(static_cast<std::size_t>(iters), 0.0);
  for (int i = 0; i < iters; ++i) {
    float milliseconds = 0;
    DSA_RETURN_IF_ERROR(cuda_status(cudaEventElapsedTime(&milliseconds, starts[static_cast<std::size_t>(i)].get(),
                                                         ends[static_cast<std::size_t>(i)].get()),
                                    "cudaEventElapsedTime"));
    times->elapsed[static_cast<std::size_t>(i)] = milliseconds * 1e-3;
  }
  return {};
}

dsa::Status CapturedGraph::capture(void* stream, const std::function<dsa::Status()>& enqueue,
                                   CapturedGraph* out) {
  // Thread-local capture: library calls may query the device (attributes,
  // occupancy) while capturing, as an engine's do.
  DSA_RETURN_IF_ERROR(cuda_status(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal),
                                  "cudaStreamBeginCapture"));
  const dsa::Status enqueued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(as_stream(stream), &graph);
  const std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> owned(graph, cudaGraphDestroy);
  DSA_RETURN_IF_ERROR(enqueued);
  DSA_RETURN_IF_ERROR(cuda_status(ended, "cudaStreamEndCapture"));
  cudaGraphExec_t exec = nullptr;
  DSA_RETURN_IF_ERROR(cuda_status(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"));
  out->exec_ = std::shared_ptr<void>(exec, [](void* e) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e)); });
  return {};
}

dsa::Status CapturedGraph::replay(void* stream) const {
  return cuda_status(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_.get()), as_stream(stream)),
                     "cudaGraphLaunch");
}

dsa::Status measure_copy_bandwidth(void* stream, std::size_t buffer_bytes, int iters,
                                   double* bytes_per_second) {
  dsa::DeviceBuffer source, destination;
  DSA_RETURN_IF_ERROR(allocate_on_current_device(buffer_bytes, &source));
  DSA_RETURN_IF_ERROR(allocate_on_current_device(buffer_bytes, &destination));
  DSA_RETURN_IF_ERROR(source.fill_bytes(1));
  RunTimes times;
  DSA_RETURN_IF_ERROR(time_device_runs(stream, 3, iters, [&](int) {
    return copy_device_to_device(destination.data(), source.data(), buffer_bytes, stream);
  }, &times));
  *bytes_per_second = 2.0 * static_cast<double>(buffer_bytes) / median(times.elapsed);
  return {};
}

dsa::Status measure_fp8_matmul_rate(void* stream, int size, int iters, MatmulRate* rate) {
  constexpr std::size_t kWorkspaceBytes = std::size_t{64} << 20;
  const std::size_t elements = static_cast<std::size_t>(size) * static_cast<std::size_t>(size);

  // bf16 output first (what fp8 products usually feed), fp32 if cuBLASLt has no algorithm for it.
  const std::pair<cudaDataType_t, const char*> outputs[] = {{CUDA_R_16BF, "bfloat16"},
                                                            {CUDA_R_32F, "float32"}};
  for (const auto& [output_type, output_name] : outputs) {
    MatmulObjects objects;
    cublasLtMatmulHeuristicResult_t heuristic{};
    bool found = false;
    DSA_RETURN_IF_ERROR(plan_fp8_matmul(size, output_type, kWorkspaceBytes, &objects, &heuristic, &found));
    if (!found) continue;

    const std::size_t output_bytes = elements * (output_type == CUDA_R_32F ? 4 : 2);
    dsa::DeviceBuffer a, b, d, workspace;
    DSA_RETURN_IF_ERROR(allocate_on_current_device(elements, &a));
    DSA_RETURN_IF_ERROR(allocate_on_current_device(elements, &b));
    DSA_RETURN_IF_ERROR(allocate_on_current_device(output_bytes, &d));
    DSA_RETURN_IF_ERROR(allocate_on_current_device(kWorkspaceBytes, &workspace));
    fill_fp8_kernel<<<fill_blocks(elements), kFillThreads, 0, as_stream(stream)>>>(
        static_cast<unsigned char*>(a.data()), elements, 11);
    fill_fp8_kernel<<<fill_blocks(elements), kFillThreads, 0, as_stream(stream)>>>(
        static_cast<unsigned char*>(b.data()), elements, 12);
    DSA_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "fill_fp8_kernel"));

    const float alpha = 1.0f, beta = 0.0f;
    RunTimes times;
    DSA_RETURN_IF_ERROR(time_device_runs(stream, 3, iters, [&](int) {
      return cublas_status(cublasLtMatmul(objects.handle, objects.desc, &alpha, a.data(), objects.a, b.data(),
                                          objects.b, &beta, d.data(), objects.d, d.data(), objects.d,
                                          &heuristic.algo, workspace.data(), kWorkspaceBytes,
                                          as_stream(stream)),
                           "cublasLtMatmul");
    }, &times));
    rate->size = size;
    rate->output_type = output_name;
    rate->flops_per_second = 2.0 * static_cast<double>(size) * size * size / median(times.elapsed);
    return {};
  }
  return {dsa::ErrorCode::unsupported, "cuBLASLt offers no fp8 e4m3 matrix product on this device"};
}

dsa::Status measure_fp8_tensor_core_rate(void* stream, int iters, TensorCoreRate* rate) {
  int device = 0, major = 0, minor = 0, multiprocessors = 0;
  DSA_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  DSA_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                                  "cudaDeviceGetAttribute"));
  DSA_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
                                  "cudaDeviceGetAttribute"));
  DSA_RETURN_IF_ERROR(cuda_status(
      cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute"));
  if (major != 9 || minor != 0) {
    return {dsa::ErrorCode::unsupported, "wgmma needs an sm_90 GPU, this one is sm_" + std::to_string(major) +
                                             std::to_string(minor)};
  }
  *rate = {};
  const auto keep = [&](int n, double flops_per_second, int ctas, int warpgroups_per_sm) {
    rate->by_n.emplace_back(n, flops_per_second);
    if (flops_per_second > rate->flops_per_second) {
      rate->flops_per_second = flops_per_second;
      rate->n = n;
      rate->ctas = ctas;
      rate->warpgroups_per_sm = warpgroups_per_sm;
    }
  };
  double flops_per_second = 0;
  int ctas = 0, warpgroups_per_sm = 0;
  DSA_RETURN_IF_ERROR(time_fp8_peak<128>(stream, iters, multiprocessors, &flops_per_second, &ctas, &warpgroups_per_sm));
  keep(128, flops_per_second, ctas, warpgroups_per_sm);
  DSA_RETURN_IF_ERROR(time_fp8_peak<256>(stream, iters, multiprocessors, &flops_per_second, &ctas, &warpgroups_per_sm));
  keep(256, flops_per_second, ctas, warpgroups_per_sm);
  return {};
}

dsa::Status device_memory(std::size_t* free_bytes, std::size_t* total_bytes) {
  return cuda_status(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

dsa::Status copy_device_to_device(void* dst, const void* src, std::size_t bytes, void* stream) {
  return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)),
                     "cudaMemcpyAsync");
}

dsa::Status synchronize_stream(void* stream) {
  return cuda_status(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
}

dsa::Status gather_request_keys_on_device(const dsa::KeyCacheLayout& layout, const std::int32_t* table_row,
                                          std::int64_t tokens, const void* cache, void* codes, void* scales,
                                          void* stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (layout.code_bytes() % 16 != 0 || layout.min_page_bytes() % 16 != 0 || !aligned(cache) || !aligned(codes) ||
      !aligned(scales)) {
    return {dsa::ErrorCode::invalid_argument,
            "gather_request_keys_on_device: cache, codes and scales must be 16-byte aligned, and a token's code "
            "bytes and a page's bytes multiples of 16"};
  }
  if (tokens <= 0) return {};
  const std::int64_t pages = (tokens + layout.page_tokens - 1) / layout.page_tokens;
  if (pages > std::numeric_limits<int>::max()) {
    return {dsa::ErrorCode::invalid_argument, "gather_request_keys_on_device: tokens: more pages than a grid holds"};
  }
  gather_pages_kernel<<<static_cast<unsigned>(pages), kGatherThreads, 0, as_stream(stream)>>>(
      static_cast<const unsigned char*>(cache), layout.min_page_bytes(), table_row, tokens, layout.page_tokens,
      static_cast<int>(layout.code_bytes()), static_cast<unsigned char*>(codes), static_cast<unsigned char*>(scales));
  return cuda_status(cudaGetLastError(), "gather_pages_kernel");
}

dsa::Status fill_random_bf16(void* dst, std::size_t count, std::size_t row_length, std::uint64_t seed,
                             void* stream) {
  if (count == 0) return {};
  fill_bf16_kernel<<<fill_blocks(count), kFillThreads, 0, as_stream(stream)>>>(
      static_cast<__nv_bfloat16*>(dst), count, std::max<std::size_t>(row_length, 1), seed);
  return cuda_status(cudaGetLastError(), "fill_bf16_kernel");
}

dsa::Status fill_logits(float* dst, std::size_t count, LogitsDistribution distribution, std::uint64_t seed,
                        void* stream) {
  if (count == 0) return {};
  fill_logits_kernel<<<fill_blocks(count), kFillThreads, 0, as_stream(stream)>>>(
      dst, count, static_cast<int>(distribution), seed);
  return cuda_status(cudaGetLastError(), "fill_logits_kernel");
}

}  // namespace dsa_cli
