// The selector warps of the fused index_topk's selection kernel: the role
// the sm_90a logits kernel (hopper/logits_sm90_kernel.cuh) gives its
// selector warpgroup when kSelect is set. Each takes the page logits the
// consumers leave in shared memory and offers them to its rows' candidate
// lists (candidate_select.cuh). Included by the selection kernel's launches
// (hopper_passes.cu), the only instances of the kernel with kSelect.
#pragma once

#include <cstdint>

#include "common/cache_format.hpp"
#include "cuda/fused/candidate_lists.hpp"
#include "cuda/fused/candidate_select.cuh"
#include "cuda/hopper/logits_sm90_kernel.cuh"
#include "cuda/hopper/ptx.cuh"

namespace dsa::detail::cuda::hopper {

// Selector `selector` of active_selectors(kRows): takes every page's logits
// from the consumers in sequence order, offers those of its draft rows to
// their candidate lists (candidate_select.cuh) and releases the stage to the
// producers. It looks one stage ahead, so that two consecutive pages of a
// unit that go to one part are offered together; the stage after a page
// always comes, since the producer ends the stream with one end stage per
// consumer.
template <int kRows, int kHeads>
__device__ __forceinline__ void select_pages(const LogitsKernelParams& p, unsigned char* smem,
                                             int selector) {
  using Layout = SharedLayout<kRows, kHeads, true>;
  constexpr int kStages = Layout::kStages;
  static_assert(kPagesPerOffer == 2, "one stage of look-ahead");
  static_assert(Layout::kConsumers >= kPagesPerOffer && kStages >= kPagesPerOffer);
  const StageInfo* stage_info = Layout::stage_infos(smem);
  std::uint64_t* page_empty = Layout::page_empty(smem);
  std::uint64_t* logits_ready = Layout::logits_ready(smem);
  int* histogram = Layout::selector_histogram(smem, selector);
  auto logits_of = [&](int sequence) {
    return static_cast<const float*>(Layout::page_logits_of(smem, sequence % kStages));
  };
  auto take = [&](int sequence) {
    ptx::mbarrier_wait(&logits_ready[sequence % kStages], (sequence / kStages) & 1);
    return stage_info[sequence % kStages];
  };
  UnitLists<kRows> unit;
  unit.selector = selector;
  int sequence = 0;
  StageInfo stage = take(sequence);
  while (stage.kind != kStageEnd) {
    const StageInfo next = take(sequence + 1);
    if (stage.first_row != unit.first_row) {
      close_lists(p.lists, unit);
      // The first page a worker scores of a unit is the unit's first page
      // unless the worker's range starts inside the unit.
      open_lists(p.lists, p.select_lengths, p.select_floors, p.select_k, stage.first_row,
                 stage.first_position != 0, unit);
    }
    const bool pair = next.kind != kStageEnd && next.first_row == stage.first_row &&
                      next.first_position == stage.first_position + kStageTokens &&
                      stage.first_position / kStageTokens % kPagesPerOffer == 0;
    // Each arm releases its own stages and moves on: with a tail shared by
    // both, the n5-n8 kernels spill 8 bytes.
    if (pair) {
      const float* const pages[2] = {logits_of(sequence), logits_of(sequence + 1)};
      offer_pages(pages, stage.first_position, p.select_k, p.keep_limit, p.lists.capacity, histogram,
                  unit);
      ptx::mbarrier_arrive(&page_empty[sequence % kStages]);
      ptx::mbarrier_arrive(&page_empty[(sequence + 1) % kStages]);
      sequence += 2;
      stage = take(sequence);
    } else {
      const float* const pages[1] = {logits_of(sequence)};
      offer_pages(pages, stage.first_position, p.select_k, p.keep_limit, p.lists.capacity, histogram,
                  unit);
      ptx::mbarrier_arrive(&page_empty[sequence % kStages]);
      sequence += 1;
      stage = next;
    }
  }
  close_lists(p.lists, unit);
}

}  // namespace dsa::detail::cuda::hopper
