// Per-call worker threads for the multithreaded CPU path. Threads are created
// for one call and joined before it returns; nothing is shared between calls.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "dsa/context.hpp"

namespace dsa::detail::cpu {

// ctx.num_threads, or the hardware concurrency when it is 0 (at least 1).
inline int thread_count(const ExecContext& ctx) {
  if (ctx.num_threads > 0) return ctx.num_threads;
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware > 0 ? static_cast<int>(hardware) : 1;
}

// Runs body(thread_index) for every index in [0, threads): index 0 on the
// calling thread, the others on threads of their own. When the system cannot
// start one, the calling thread runs that index and the ones after it.
template <typename Body>
void run_on_threads(int threads, Body&& body) {
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<std::size_t>(std::max(threads - 1, 0)));
  int started = 1;
  for (; started < threads; ++started) {
    try {
      helpers.emplace_back([&body, t = started] { body(t); });
    } catch (const std::system_error&) {
      break;
    }
  }
  body(0);
  for (int t = started; t < threads; ++t) body(t);
  for (std::thread& helper : helpers) helper.join();
}

// Calls body(item, thread_index) for every item in [0, count), handing items
// out one at a time so uneven items (long and short rows) balance. Which
// thread runs an item never affects what it computes.
template <typename Body>
void parallel_for_items(std::int64_t count, const ExecContext& ctx, Body&& body) {
  const int threads = static_cast<int>(std::min<std::int64_t>(thread_count(ctx), count));
  if (threads <= 1) {
    for (std::int64_t item = 0; item < count; ++item) body(item, 0);
    return;
  }
  std::atomic<std::int64_t> next{0};
  run_on_threads(threads, [&](int thread_index) {
    for (std::int64_t item = next.fetch_add(1); item < count; item = next.fetch_add(1)) {
      body(item, thread_index);
    }
  });
}

}  // namespace dsa::detail::cpu
