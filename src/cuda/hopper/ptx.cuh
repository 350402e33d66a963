// Thin wrappers around the sm_90a PTX the Hopper kernels use: mbarriers, bulk
// and tensor (TMA) copies, per-thread asynchronous copies (cp.async),
// warpgroup matrix products (wgmma) and register reallocation. This file is
// the only place that holds inline PTX.
//
// Every wrapper compiles to nothing outside sm_90a device code, so the
// translation units that include it still build for the generic PTX target;
// the kernels using them are themselves only instantiated with bodies there.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSA_SM90A_ENABLED 1
#else
#define DSA_SM90A_ENABLED 0
#endif

namespace dsa::detail::cuda::hopper::ptx {

__device__ __forceinline__ std::uint32_t smem_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// ---- mbarrier ---------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(std::uint64_t* barrier, std::uint32_t arrivals) {
#if DSA_SM90A_ENABLED
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(barrier)),
               "r"(arrivals));
#else
  (void)barrier;
  (void)arrivals;
#endif
}

// Makes initialized barriers visible to the other threads and to the async proxy.
__device__ __forceinline__ void fence_barrier_init() {
#if DSA_SM90A_ENABLED
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* barrier) {
#if DSA_SM90A_ENABLED
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_address(barrier))
               : "memory");
#else
  (void)barrier;
#endif
}

// Counts as `arrivals` arrivals at once.
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* barrier, std::uint32_t arrivals) {
#if DSA_SM90A_ENABLED
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(
                   smem_address(barrier)),
               "r"(arrivals)
               : "memory");
#else
  (void)barrier;
  (void)arrivals;
#endif
}

// Arrives and adds `bytes` to the transaction count the current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* barrier,
                                                          std::uint32_t bytes) {
#if DSA_SM90A_ENABLED
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(
                   smem_address(barrier)),
               "r"(bytes)
               : "memory");
#else
  (void)barrier;
  (void)bytes;
#endif
}

// Adds `bytes` to the transaction count the current phase waits for, without
// arriving.
__device__ __forceinline__ void mbarrier_expect_tx(std::uint64_t* barrier, std::uint32_t bytes) {
#if DSA_SM90A_ENABLED
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_address(barrier)),
               "r"(bytes)
               : "memory");
#else
  (void)barrier;
  (void)bytes;
#endif
}

// Blocks until the phase with parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* barrier, std::uint32_t parity) {
#if DSA_SM90A_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_address(barrier)),
      "r"(parity)
      : "memory");
#else
  (void)barrier;
  (void)parity;
#endif
}

// ---- bulk and tensor copies (global -> shared, completing on an mbarrier) ----

__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
#if DSA_SM90A_ENABLED
  asm volatile("prefetch.tensormap [%0];" ::"l"(tensor_map) : "memory");
#else
  (void)tensor_map;
#endif
}

// Contiguous copy; `bytes`, both addresses multiples of 16.
__device__ __forceinline__ void bulk_copy(void* destination, const void* source,
                                          std::uint32_t bytes, std::uint64_t* barrier) {
#if DSA_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_address(destination)),
      "l"(source), "r"(bytes), "r"(smem_address(barrier))
      : "memory");
#else
  (void)destination;
  (void)source;
  (void)bytes;
  (void)barrier;
#endif
}

__device__ __forceinline__ void tensor_copy_2d(void* destination, const void* tensor_map, int c0,
                                               int c1, std::uint64_t* barrier) {
#if DSA_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_address(destination)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(smem_address(barrier))
      : "memory");
#else
  (void)destination;
  (void)tensor_map;
  (void)c0;
  (void)c1;
  (void)barrier;
#endif
}
__device__ __forceinline__ void tensor_copy_3d(void* destination, const void* tensor_map, int c0,
                                               int c1, int c2, std::uint64_t* barrier) {
#if DSA_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_address(destination)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(barrier))
      : "memory");
#else
  (void)destination;
  (void)tensor_map;
  (void)c0;
  (void)c1;
  (void)c2;
  (void)barrier;
#endif
}

__device__ __forceinline__ void tensor_copy_4d(void* destination, const void* tensor_map, int c0,
                                               int c1, int c2, int c3, std::uint64_t* barrier) {
#if DSA_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(smem_address(destination)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_address(barrier))
      : "memory");
#else
  (void)destination;
  (void)tensor_map;
  (void)c0;
  (void)c1;
  (void)c2;
  (void)c3;
  (void)barrier;
#endif
}

// ---- per-thread asynchronous copies (cp.async) ---------------------------------

// kBytes (4, 8 or 16) from global to shared memory, both addresses aligned
// to kBytes, in the thread's current group; the data is the thread's once
// the group is waited for. 16-byte copies bypass L1 (read once).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* destination, const void* source) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if DSA_SM90A_ENABLED
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_address(destination)),
                 "l"(source)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem_address(destination)),
                 "l"(source), "n"(kBytes)
                 : "memory");
  }
#else
  (void)destination;
  (void)source;
#endif
}

// Closes the thread's current group of copies (an empty group when it made none).
__device__ __forceinline__ void cp_async_commit() {
#if DSA_SM90A_ENABLED
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most kPending of the thread's groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if DSA_SM90A_ENABLED
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// Orders this thread's earlier shared-memory writes before later reads of
// the async proxy (wgmma operands).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if DSA_SM90A_ENABLED
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// ---- named barriers ------------------------------------------------------------

// Barrier `id` (1..15; 0 is __syncthreads') of `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
#if DSA_SM90A_ENABLED
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
#else
  (void)id;
  (void)threads;
#endif
}

// As named_barrier_sync, returning whether `value` held in any of the threads.
__device__ __forceinline__ bool named_barrier_or(int id, int threads, bool value) {
#if DSA_SM90A_ENABLED
  int any = 0;
  asm volatile(
      "{\n.reg .pred p, q;\n"
      "setp.ne.b32 p, %1, 0;\n"
      "barrier.cta.red.or.pred q, %2, %3, p;\n"
      "selp.b32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<int>(value)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
#else
  (void)id;
  (void)threads;
  return value;
#endif
}

// ---- warp specialization ------------------------------------------------------

// Register reallocation between warpgroups; every warp of the warpgroup executes it.
template <int kRegisters>
__device__ __forceinline__ void raise_register_limit() {
#if DSA_SM90A_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
#endif
}
template <int kRegisters>
__device__ __forceinline__ void lower_register_limit() {
#if DSA_SM90A_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
#endif
}

// A flag in shared memory published by one warp and polled by others: the
// release orders the publisher's earlier work (barrier arrivals included)
// before the flag; the acquire orders the reader's later work after it.
__device__ __forceinline__ void store_release_cta(std::int32_t* flag, std::int32_t value) {
  asm volatile("st.release.cta.shared::cta.b32 [%0], %1;" ::"r"(smem_address(flag)), "r"(value)
               : "memory");
}

__device__ __forceinline__ std::int32_t load_acquire_cta(const std::int32_t* flag) {
  std::int32_t value;
  asm volatile("ld.acquire.cta.shared::cta.b32 %0, [%1];"
               : "=r"(value)
               : "r"(smem_address(flag))
               : "memory");
  return value;
}

// True in exactly one lane of the (fully active) warp.
__device__ __forceinline__ bool elect_one() {
#if DSA_SM90A_ENABLED
  std::uint32_t elected = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "elect.sync _|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(elected));
  return elected != 0;
#else
  return false;
#endif
}

// ---- wgmma ------------------------------------------------------------------

// Shared-memory matrix descriptor of a K-major operand stored as rows of 128
// bytes with the 128-byte swizzle (what a SWIZZLE_128B tensor copy writes):
// groups of 8 rows are 1024 bytes apart; the leading offset is unused. The
// upper word (row-group stride, swizzle mode) is the same for every such
// tile, so only the lower word, which holds the start address in 16-byte
// units, is computed: a small offset added to it moves the start without a
// carry (shared addresses stay below 2^18 bytes, the field's 14 bits).
inline constexpr std::uint32_t kSwizzle128DescriptorHigh = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ std::uint32_t k_major_swizzle128_descriptor_low(const void* tile) {
  return ((smem_address(tile) & 0x3FFFF) >> 4) | (1u << 16);
}
__device__ __forceinline__ std::uint64_t swizzle128_descriptor(std::uint32_t low) {
  return (std::uint64_t{kSwizzle128DescriptorHigh} << 32) | low;
}

// Orders register accesses before the next wgmma (required before the first
// one and whenever the accumulators were touched by ordinary instructions).
__device__ __forceinline__ void wgmma_fence() {
#if DSA_SM90A_ENABLED
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if DSA_SM90A_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Ties an accumulator register to this point of the instruction stream, so
// the compiler neither reads it before wgmma_wait nor writes it while a
// wgmma is in flight.
__device__ __forceinline__ void fence_operand(float& value) {
  asm volatile("" : "+f"(value)::"memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if DSA_SM90A_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#endif
}

// The 8-bit float types of the fp8 products' operands.
enum class Fp8Type { e4m3, e5m2 };

// D[64 x N] (+)= A[64 x 32] * B[N x 32]^T with 8-bit float operands of types
// kA and kB from shared memory (both K-major) and float32 accumulators;
// thread t of the warpgroup holds rows 16 * (t / 32) + (t % 32) / 4 + {0, 8}
// and columns 8 * i + 2 * (t % 4) + {0, 1}: d[4 i + 2 r + c] is (row offset
// 8 r, column 8 i + 2 (t % 4) + c).
template <int N, Fp8Type kA = Fp8Type::e4m3, Fp8Type kB = Fp8Type::e4m3>
struct WgmmaFp8;

// Inline PTX names its operands by number only, so a product's N / 2
// accumulators are spelled out: operands %0 .. %(N / 2 - 1) bound to d[0 ..],
// in blocks of 16 (DSA_WGMMA_ACC_n: the first n blocks), then the two
// descriptors and the accumulate flag.
#define DSA_WGMMA_ACC_1 \
  "%0, %1, %2, %3, %4, %5, %6, %7, " \
  "%8, %9, %10, %11, %12, %13, %14, %15"
#define DSA_WGMMA_ACC_2 \
  DSA_WGMMA_ACC_1 ", %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31"
#define DSA_WGMMA_ACC_3 \
  DSA_WGMMA_ACC_2 ", %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47"
#define DSA_WGMMA_ACC_4 \
  DSA_WGMMA_ACC_3 ", %48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define DSA_WGMMA_ACC_8 \
  DSA_WGMMA_ACC_4 ", %64, %65, %66, %67, %68, %69, %70, %71, " \
  "%72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, " \
  "%88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, " \
  "%104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, " \
  "%120, %121, %122, %123, %124, %125, %126, %127"
#define DSA_WGMMA_BIND8(i)                                                                        \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),     \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define DSA_WGMMA_BIND_1 DSA_WGMMA_BIND8(0), DSA_WGMMA_BIND8(8)
#define DSA_WGMMA_BIND_2 DSA_WGMMA_BIND_1, DSA_WGMMA_BIND8(16), DSA_WGMMA_BIND8(24)
#define DSA_WGMMA_BIND_3 DSA_WGMMA_BIND_2, DSA_WGMMA_BIND8(32), DSA_WGMMA_BIND8(40)
#define DSA_WGMMA_BIND_4 DSA_WGMMA_BIND_3, DSA_WGMMA_BIND8(48), DSA_WGMMA_BIND8(56)
#define DSA_WGMMA_BIND_8                                                                          \
  DSA_WGMMA_BIND_4, DSA_WGMMA_BIND8(64), DSA_WGMMA_BIND8(72), DSA_WGMMA_BIND8(80),                \
      DSA_WGMMA_BIND8(88), DSA_WGMMA_BIND8(96), DSA_WGMMA_BIND8(104), DSA_WGMMA_BIND8(112),       \
      DSA_WGMMA_BIND8(120)
#if DSA_SM90A_ENABLED
#define DSA_WGMMA_FP8_BODY(N, TYPES, ACC, A, B, FLAG, ...)                                        \
  asm volatile("{\n.reg .pred p;\n"                                                               \
               "setp.ne.b32 p, " FLAG ", 0;\n"                                                    \
               "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." TYPES " "                        \
               "{" ACC "}, " A ", " B ", p, 1, 1;\n}\n"                                           \
               : __VA_ARGS__                                                                      \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#else
#define DSA_WGMMA_FP8_BODY(N, TYPES, ACC, A, B, FLAG, ...)                                        \
  (void)d;                                                                                        \
  (void)desc_a;                                                                                   \
  (void)desc_b;                                                                                   \
  (void)accumulate;
#endif
#define DSA_WGMMA_FP8(N, KA, KB, TYPES, ACC, A, B, FLAG, ...)                                     \
  template <>                                                                                     \
  struct WgmmaFp8<N, Fp8Type::KA, Fp8Type::KB> {                                                  \
    static __device__ __forceinline__ void mma(float (&d)[N / 2], std::uint64_t desc_a,           \
                                               std::uint64_t desc_b, bool accumulate) {           \
      DSA_WGMMA_FP8_BODY(N, TYPES, ACC, A, B, FLAG, __VA_ARGS__)                                  \
    }                                                                                             \
  };
// Every product width for one pair of operand types.
#define DSA_WGMMA_FP8_WIDTHS(KA, KB, TYPES)                                                       \
  DSA_WGMMA_FP8(32, KA, KB, TYPES, DSA_WGMMA_ACC_1, "%16", "%17", "%18", DSA_WGMMA_BIND_1)        \
  DSA_WGMMA_FP8(64, KA, KB, TYPES, DSA_WGMMA_ACC_2, "%32", "%33", "%34", DSA_WGMMA_BIND_2)        \
  DSA_WGMMA_FP8(128, KA, KB, TYPES, DSA_WGMMA_ACC_4, "%64", "%65", "%66", DSA_WGMMA_BIND_4)       \
  DSA_WGMMA_FP8(256, KA, KB, TYPES, DSA_WGMMA_ACC_8, "%128", "%129", "%130", DSA_WGMMA_BIND_8)

DSA_WGMMA_FP8_WIDTHS(e4m3, e4m3, "e4m3.e4m3")
// fp4 keys (as e5m2) against fp8 or fp4 (as e5m2) queries.
DSA_WGMMA_FP8_WIDTHS(e5m2, e4m3, "e5m2.e4m3")
DSA_WGMMA_FP8_WIDTHS(e5m2, e5m2, "e5m2.e5m2")
#undef DSA_WGMMA_FP8_WIDTHS
#undef DSA_WGMMA_FP8
#undef DSA_WGMMA_FP8_BODY
#undef DSA_WGMMA_ACC_1
#undef DSA_WGMMA_ACC_2
#undef DSA_WGMMA_ACC_3
#undef DSA_WGMMA_ACC_4
#undef DSA_WGMMA_ACC_8
#undef DSA_WGMMA_BIND8
#undef DSA_WGMMA_BIND_1
#undef DSA_WGMMA_BIND_2
#undef DSA_WGMMA_BIND_3
#undef DSA_WGMMA_BIND_4
#undef DSA_WGMMA_BIND_8

}  // namespace dsa::detail::cuda::hopper::ptx
