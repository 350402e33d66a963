// CUDA top-k: exact, deterministic radix selection (see topk/row_select.cuh).
//
// On sm_90 each row is handled by a thread block cluster of up to 8 CTAs that
// each copy one segment of the row into shared memory once and select there,
// summing histograms through distributed shared memory. Elsewhere (or when a
// row is too long for the cluster's shared memory) one CTA per row reads its
// row from global memory on every pass.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend.hpp"
#include "cuda/launch_utils.hpp"
#include "cuda/topk/row_select.cuh"
#include "device_error.hpp"

namespace dsa::detail::cuda {
namespace {

using topk_impl::kThreads;
using topk_impl::TopkArgs;

// Shared memory a CTA of the cluster path aims for: small enough that a few
// CTAs share a multiprocessor, so one CTA's copy overlaps another's selection.
constexpr std::int64_t kTargetSegmentBytes = 48 * 1024;
// CTAs of the cluster kernel per multiprocessor that the register budget is
// sized for. At the target segment a CTA needs about 80 KiB of shared memory,
// so two share a multiprocessor; budgeting registers for three (40 per
// thread) makes the kernel spill.
constexpr int kClusterBlocksPerMultiprocessor = 2;

template <typename Bits>
__global__ void __launch_bounds__(kThreads, kClusterBlocksPerMultiprocessor)
    topk_cluster_kernel(TopkArgs args) {
  extern __shared__ __align__(16) unsigned char shared_base[];
  const std::int64_t row = blockIdx.x / static_cast<unsigned>(args.group_size);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  topk_impl::select_row<Bits, topk_impl::BlockCluster, true>(args, row, shared_base);
#else
  // Compiled for a target without clusters but launched on a GPU with them
  // (PTX compiled just in time): the first CTA of each group does the row.
  if (blockIdx.x % static_cast<unsigned>(args.group_size) == 0) {
    topk_impl::select_row<Bits, topk_impl::SingleBlock, false>(args, row, shared_base);
  }
#endif
}

template <typename Bits>
__global__ void __launch_bounds__(kThreads) topk_block_kernel(TopkArgs args) {
  extern __shared__ __align__(16) unsigned char shared_base[];
  topk_impl::select_row<Bits, topk_impl::SingleBlock, false>(args, blockIdx.x, shared_base);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct ClusterPlan {
  int cluster_size = 0;  // 0: the cluster path cannot serve this problem
  std::size_t shared_bytes = 0;
  int survivor_offset = 0;  // see TopkArgs::survivor_offset
};

// Splits `cols` positions over 1..8 CTAs whose segments fit in shared memory.
template <typename Bits>
ClusterPlan plan_cluster(const TopkProblem& p, int device, std::int64_t target_segment_bytes) {
  int major = 0;
  int max_shared = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return {};
  }
  if (major < 9) return {};
  const std::int64_t target_values = target_segment_bytes / static_cast<std::int64_t>(sizeof(Bits));
  const int cluster_size = static_cast<int>(
      std::clamp<std::int64_t>(ceil_div(p.cols, target_values), 1, topk_impl::kMaxGroupSize));
  const std::int64_t share = ceil_div(ceil_div(p.cols, cluster_size), topk_impl::kSegmentGranule) *
                             topk_impl::kSegmentGranule;
  const std::int64_t segment_values = share + 16 / static_cast<std::int64_t>(sizeof(Bits));
  std::size_t segment_bytes = static_cast<std::size_t>(
      ceil_div(segment_values * static_cast<std::int64_t>(sizeof(Bits)), 16) * 16);
  if (p.sorted) {
    segment_bytes =
        std::max(segment_bytes, sizeof(typename topk_impl::WinnerSort<Bits>::TempStorage));
  }
  std::size_t shared_bytes = topk_impl::kSegmentOffset + segment_bytes;
  int survivor_offset = 0;
  // Survivor lists hold 16-bit positions within the segment, a quarter of
  // each warp's range (see select_segment).
  if (share <= 65536) {
    const std::int64_t per_warp = (ceil_div(share, topk_impl::kWarps) + 31) / 32 * 32;
    survivor_offset = static_cast<int>(shared_bytes);
    shared_bytes +=
        static_cast<std::size_t>(ceil_div(topk_impl::kWarps * (per_warp / 4) * 2, 16) * 16);
  }
  if (shared_bytes > static_cast<std::size_t>(max_shared)) return {};
  return {cluster_size, shared_bytes, survivor_offset};
}

template <typename Bits>
Status launch_topk(const TopkProblem& p, TopkArgs args, cudaStream_t stream, int device,
                   std::int64_t target_segment_bytes) {
  const ClusterPlan plan = plan_cluster<Bits>(p, device, target_segment_bytes);
  if (plan.cluster_size > 0) {
    args.group_size = plan.cluster_size;
    args.survivor_offset = plan.survivor_offset;
    auto kernel = topk_cluster_kernel<Bits>;
    DSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(plan.shared_bytes)));
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(p.rows * plan.cluster_size));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = plan.shared_bytes;
    config.stream = stream;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(plan.cluster_size);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    // A partitioned GPU may have too few multiprocessors per GPC for the
    // cluster; then one CTA per row serves instead.
    int active_clusters = 0;
    const cudaError_t occupancy = cudaOccupancyMaxActiveClusters(&active_clusters, kernel, &config);
    if (occupancy != cudaSuccess) cudaGetLastError();
    if (occupancy != cudaSuccess || active_clusters > 0) {
      DSA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args));
      return Status::success();
    }
  }
  args.group_size = 1;
  args.survivor_offset = 0;
  auto kernel = topk_block_kernel<Bits>;
  const std::size_t shared_bytes =
      topk_impl::kSegmentOffset +
      (p.sorted ? sizeof(typename topk_impl::WinnerSort<Bits>::TempStorage) : 0);
  DSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(shared_bytes)));
  kernel<<<static_cast<unsigned>(p.rows), kThreads, shared_bytes, stream>>>(args);
  DSA_CUDA_CHECK_LAUNCH("topk_block_kernel");
  return Status::success();
}

}  // namespace

std::size_t topk_workspace_bytes(std::int64_t /*rows*/, std::int64_t /*max_length*/, int /*k*/,
                                 int /*device*/) {
  return kDeviceErrorRecordBytes;
}

Status topk(const TopkProblem& p, const ExecContext& ctx) {
  DeviceGuard guard;
  DSA_RETURN_IF_ERROR(guard.enter(p.device.index));
  DSA_RETURN_IF_ERROR(clear_device_error(ctx));
  if (p.rows == 0) return Status::success();
  TopkArgs args;
  args.logits = p.logits;
  args.logits_stride = p.logits_stride;
  args.cols = p.cols;
  args.lengths = p.lengths;
  args.lengths_stride = p.lengths_stride;
  args.k = p.k;
  args.indices = p.indices;
  args.indices_stride = p.indices_stride;
  args.sorted = p.sorted;
  args.block_table = p.block_table;
  args.block_table_stride = p.block_table_stride;
  args.max_blocks = p.max_blocks;
  args.rows_per_request = p.rows_per_request;
  args.error = error_record(ctx);
  return p.logits_dtype == DType::bfloat16
             ? launch_topk<std::uint16_t>(p, args, stream_of(ctx), p.device.index,
                                          kTargetSegmentBytes)
             : launch_topk<std::uint32_t>(p, args, stream_of(ctx), p.device.index,
                                          kTargetSegmentBytes);
}

}  // namespace dsa::detail::cuda
