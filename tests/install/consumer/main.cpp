// Uses the installed library through its public API on the CPU and checks the
// results: causal context lengths and a sorted top-k. Exit status 0 when all
// agree, 1 otherwise.
#include <dsa/dsa.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

void check_status(const dsa::Status& status, const char* what) {
  if (!status.ok()) std::fprintf(stderr, "%s: %s\n", what, status.to_string().c_str());
  check(status.ok(), what);
}

}  // namespace

int main() {
  // The DSA_WITH_CUDA definition travels with dsa::indexer exactly when the
  // library holds the CUDA backends.
#ifdef DSA_WITH_CUDA
  check(dsa::built_with_cuda(), "DSA_WITH_CUDA is defined but the library has no CUDA backends");
#else
  check(!dsa::built_with_cuda(), "the library has CUDA backends but DSA_WITH_CUDA is not defined");
#endif
  // Links the CUDA runtime in CUDA builds; 0 without a GPU.
  check(dsa::cuda_device_count() >= 0, "cuda_device_count");

  dsa::ExecContext ctx;  // automatic: host tensors run on the CPU backend

  // Causal lengths: L[b, j] = prefix[b] + j + 1.
  std::vector<std::int32_t> prefix{5, 0, 70};
  std::vector<std::int32_t> lens(6, -1);
  check_status(dsa::causal_context_lens(dsa::make_view(prefix.data(), dsa::DType::int32, {3}), 2,
                                        dsa::make_view(lens.data(), dsa::DType::int32, {3, 2}), ctx),
               "causal_context_lens");
  check(lens == std::vector<std::int32_t>{6, 7, 1, 2, 71, 72}, "causal_context_lens values");

  // Top-3 of two rows, sorted (ties: the smaller position first); row 1 has
  // only 2 positions, so it is 0, 1 and -1 padding.
  std::vector<float> logits{0.5f, -1.f, 3.f, 2.f, 3.f, 7.f, -2.f, 0.f,  //
                            9.f,  8.f,  7.f, 6.f, 5.f, 4.f, 3.f,  2.f};
  std::vector<std::int32_t> lengths{8, 2};
  std::vector<std::int32_t> indices(6, -7);
  dsa::TopkOptions options;
  options.sorted = true;
  check_status(dsa::topk(dsa::make_view(logits.data(), dsa::DType::float32, {2, 8}),
                         dsa::make_view(lengths.data(), dsa::DType::int32, {2}), 3,
                         dsa::make_view(indices.data(), dsa::DType::int32, {2, 3}), options, ctx),
               "topk");
  check(indices == std::vector<std::int32_t>{5, 2, 4, 0, 1, -1}, "topk indices");

  if (failures != 0) return 1;
  std::printf("dsa-indexer %s CUDA: causal_context_lens and topk ok\n",
              dsa::built_with_cuda() ? "with" : "without");
  return 0;
}
