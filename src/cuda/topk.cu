// CUDA top-k: exact, deterministic selection that reads each row once (see
// topk/row_select.cuh).
//
// On sm_90, when there are too few rows to occupy the GPU and the rows are
// long enough for the split to pay (split_pays), each row is handled by a
// thread block cluster of up to 8 CTAs that each scan one segment; the
// cluster's first CTA finishes the row through distributed shared memory.
// Otherwise one CTA handles each row; the CTAs after the first wave take the
// remaining rows longest first.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend.hpp"
#include "common/device_error.hpp"
#include "cuda/grid_dependency.cuh"
#include "cuda/launch_utils.hpp"
#include "cuda/topk/row_select.cuh"

namespace dsa::detail::cuda {
namespace {

using topk_impl::kThreads;
using topk_impl::SharedStorage;
using topk_impl::TopkArgs;

// Two CTAs share a multiprocessor (about 73 KiB of shared memory and 64
// registers per thread each), so one CTA's loads overlap the other's
// selection work.
constexpr int kBlocksPerMultiprocessor = 2;
// A segment shorter than this is not worth another CTA.
constexpr std::int64_t kMinSegmentValues = 8192;
// Rows are ordered by length (row_by_length) only when some may be longer
// than this: shorter rows take about as long as each other (the fixed phases
// dominate), and the ordering costs each CTA of the second wave a fixed time.
constexpr std::int64_t kMinOrderedLength = 49152;
// Segments beyond this would overflow the candidate list (see
// kCandidateCapacity) and take the slow path.
constexpr std::int64_t kMaxSegmentValues = 131072;
// What a cluster's exchanges (count merge, gather, the first CTA finishing
// alone) cost, in values one CTA scans in that time: about 64K on an H200,
// where rows of 32K-64K on average run faster one CTA per row and only
// logits over ~80K wide gain from clusters (docs/performance.md).
constexpr std::int64_t kClusterCostValues = 65536;

template <typename Bits>
__global__ void __launch_bounds__(kThreads, kBlocksPerMultiprocessor)
    topk_cluster_kernel(TopkArgs args) {
  extern __shared__ __align__(16) unsigned char shared_base[];
  auto& storage = *reinterpret_cast<SharedStorage*>(shared_base);
  const auto row_of = [&] {
    return std::int64_t{blockIdx.x / static_cast<unsigned>(args.group_size)};
  };
  enter_dependent_grid();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  topk_impl::select_row<Bits, topk_impl::BlockCluster>(args, row_of, storage);
#else
  // Compiled for a target without clusters but launched on a GPU with them
  // (PTX compiled just in time): the first CTA of each group does the row.
  if (blockIdx.x % static_cast<unsigned>(args.group_size) == 0) {
    topk_impl::select_row<Bits, topk_impl::SingleBlock>(args, row_of, storage);
  }
#endif
}

template <typename Bits>
__global__ void __launch_bounds__(kThreads, kBlocksPerMultiprocessor)
    topk_block_kernel(TopkArgs args) {
  extern __shared__ __align__(16) unsigned char shared_base[];
  auto& storage = *reinterpret_cast<SharedStorage*>(shared_base);
  enter_dependent_grid();
  const int second_wave = args.second_wave;
  const bool ordered = second_wave > 0 && static_cast<int>(blockIdx.x) >= second_wave;
  if (ordered) {
    topk_impl::row_by_length(args, second_wave, static_cast<int>(gridDim.x),
                             static_cast<int>(blockIdx.x) - second_wave, storage);
  }
  const auto row_of = [&] {
    return std::int64_t{ordered ? topk_impl::ordered_row(storage) : static_cast<int>(blockIdx.x)};
  };
  topk_impl::select_row<Bits, topk_impl::SingleBlock>(args, row_of, storage);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Fewest CTAs per row whose segments fit the candidate list.
std::int64_t min_cluster_size(const TopkProblem& p) { return ceil_div(p.cols, kMaxSegmentValues); }

// Whether splitting each row over `size` CTAs beats one CTA per row: rows
// one CTA cannot hold, or a split that saves more scanning than its
// exchanges cost.
bool split_pays(const TopkProblem& p, std::int64_t size) {
  return min_cluster_size(p) > 1 || (size > 1 && p.cols - p.cols / size > kClusterCostValues);
}

// CTAs per row for the cluster kernel: enough CTAs to occupy every
// multiprocessor twice, segments neither too short nor too long for the
// candidate list. 1 when clusters are unavailable or do not pay.
int cluster_size_for(const TopkProblem& p, int device) {
  int major = 0;
  int multiprocessors = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  if (major < 9) return 1;
  const std::int64_t to_fill = ceil_div(kBlocksPerMultiprocessor * multiprocessors, p.rows);
  std::int64_t size = std::min(to_fill, std::max<std::int64_t>(1, p.cols / kMinSegmentValues));
  size = std::max(size, min_cluster_size(p));
  size = std::clamp<std::int64_t>(size, 1, topk_impl::kMaxGroupSize);
  return split_pays(p, size) ? static_cast<int>(size) : 1;
}

// Clusters of `cluster_size` CTAs of the cluster kernel that device `device`
// holds at once (asked once per device and size: the answer depends on
// neither the grid nor the stream), or -1 when the runtime cannot tell.
template <typename Bits>
int resident_clusters(int cluster_size, int device) {
  static OncePerDevice<int> resident[topk_impl::kMaxGroupSize + 1];
  return resident[cluster_size].get(device, [&] {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(cluster_size));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = sizeof(SharedStorage);
    cudaLaunchAttribute attribute = cluster_attribute(static_cast<unsigned>(cluster_size));
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, topk_cluster_kernel<Bits>, &config) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return clusters;
  });
}

template <typename Bits>
Status launch_topk_kernels(const TopkProblem& p, TopkArgs args, const ExecContext& ctx) {
  constexpr std::size_t kSharedBytes = sizeof(SharedStorage);
  const int device = p.device.index;
  int cluster_size = cluster_size_for(p, device);
  if (cluster_size > 1) {
    constexpr auto kernel = &topk_cluster_kernel<Bits>;
    DSA_RETURN_IF_ERROR(allow_shared_bytes<kernel>(kSharedBytes));
    // Rows are short work each, so a second wave of clusters would nearly
    // double the call: the cluster shrinks (down to what the candidate list
    // needs) until the GPU holds a cluster for every row at once. Where the
    // clusters left no longer pay, or the GPU holds none, one CTA per row
    // serves.
    int active_clusters = 0;
    for (;;) {
      active_clusters = resident_clusters<Bits>(cluster_size, device);
      if (active_clusters < 0) break;
      if (active_clusters >= p.rows || cluster_size <= std::max<std::int64_t>(2, min_cluster_size(p))) break;
      --cluster_size;
    }
    // Shrunk clusters may no longer pay; a partitioned GPU may hold none.
    if (split_pays(p, cluster_size) && active_clusters != 0) {
      args.group_size = cluster_size;
      return launch_kernel("topk_cluster_kernel", kernel,
                           {dim3(static_cast<unsigned>(p.rows * cluster_size)), dim3(kThreads), kSharedBytes,
                            static_cast<unsigned>(cluster_size)},
                           ctx, args);
    }
  }
  args.group_size = 1;
  constexpr auto kernel = &topk_block_kernel<Bits>;
  DSA_RETURN_IF_ERROR(allow_shared_bytes<kernel>(kSharedBytes));
  if (p.cols > kMinOrderedLength) {
    const std::int64_t first_wave = resident_blocks<kernel>(kThreads, kSharedBytes, device);
    if (first_wave > 0 && p.rows > first_wave && p.rows - first_wave <= topk_impl::kMaxOrderedRows) {
      args.second_wave = static_cast<int>(first_wave);
    }
  }
  return launch_kernel("topk_block_kernel", kernel, {static_cast<unsigned>(p.rows), kThreads, kSharedBytes}, ctx, args);
}

}  // namespace

std::size_t topk_workspace_bytes() { return kDeviceErrorRecordBytes; }

Status topk(const TopkProblem& p, const ExecContext& ctx) {
  if (p.rows == 0) return Status::success();
  const TopkArgs args = topk_impl::topk_args(p, error_record(ctx));
  return p.logits_dtype == DType::bfloat16 ? launch_topk_kernels<std::uint16_t>(p, args, ctx)
                                           : launch_topk_kernels<std::uint32_t>(p, args, ctx);
}

}  // namespace dsa::detail::cuda
