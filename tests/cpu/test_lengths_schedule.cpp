// Context-length builders and the schedule planner on the CPU backends.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

using LengthsBuilder = dsa::Status (*)(const dsa::TensorView&, int, const dsa::TensorView&,
                                       const dsa::ExecContext&);

struct Convention {
  const char* name;
  LengthsBuilder build;
  std::vector<std::int32_t> (*expected)(const std::vector<std::int32_t>&, int);
};

const Convention kConventions[] = {
    {"causal", dsa::causal_context_lens, causal_lens},
    {"expanded", dsa::expanded_context_lens, expanded_lens},
    {"legacy", dsa::legacy_context_lens, legacy_lens},
};

class LengthsTest : public ::testing::TestWithParam<dsa::Backend> {};

TEST_P(LengthsTest, ConventionsMatchTheirFormulas) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  Rng rng(3);
  std::uniform_int_distribution<std::int32_t> length(0, 5000);
  for (const Convention& convention : kConventions) {
    for (const std::int64_t batch : {0, 1, 5, 33}) {
      for (int next_n = 1; next_n <= 8; ++next_n) {
        SCOPED_TRACE(std::string(convention.name) + " batch " + std::to_string(batch) + " next_n " +
                     std::to_string(next_n));
        std::vector<std::int32_t> input;
        for (std::int64_t b = 0; b < batch; ++b) input.push_back(b % 4 == 1 ? static_cast<std::int32_t>(b % 3) : length(rng));
        std::vector<std::int32_t> out(static_cast<std::size_t>(batch * next_n) + 1, -5);
        DSA_ASSERT_OK(convention.build(view_of(input, {batch}), next_n, view_of(out, {batch, next_n}), ctx));
        out.pop_back();
        EXPECT_EQ(out, convention.expected(input, next_n));
      }
    }
  }
}

TEST_P(LengthsTest, StridedInputAndOutput) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  const std::vector<std::int32_t> prefix{7, 0, 300, 64, 1};
  std::vector<std::int32_t> strided_in;
  for (const std::int32_t p : prefix) strided_in.insert(strided_in.end(), {p, -1, -1});
  constexpr int kNextN = 3;
  for (const Convention& convention : kConventions) {
    SCOPED_TRACE(convention.name);
    // Output rows padded to 4 columns; the padding must stay untouched.
    std::vector<std::int32_t> out(prefix.size() * 4, -9);
    const dsa::TensorView in_view =
        dsa::make_view(strided_in.data(), dsa::DType::int32, {static_cast<std::int64_t>(prefix.size())}, {3});
    const dsa::TensorView out_view =
        dsa::make_view(out.data(), dsa::DType::int32, {static_cast<std::int64_t>(prefix.size()), kNextN}, {4, 1});
    DSA_ASSERT_OK(convention.build(in_view, kNextN, out_view, ctx));
    const std::vector<std::int32_t> want = convention.expected(prefix, kNextN);
    for (std::size_t b = 0; b < prefix.size(); ++b) {
      for (int j = 0; j < kNextN; ++j) EXPECT_EQ(out[b * 4 + j], want[b * kNextN + j]) << b << "," << j;
      EXPECT_EQ(out[b * 4 + 3], -9);
    }
  }
}

TEST_P(LengthsTest, NegativeInputIsInvalidArgument) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  std::vector<std::int32_t> input{5, -1, 3};
  std::vector<std::int32_t> out(6);
  for (const Convention& convention : kConventions) {
    const dsa::Status s = convention.build(view_of(input, {3}), 2, view_of(out, {3, 2}), ctx);
    EXPECT_EQ(s.code(), dsa::ErrorCode::invalid_argument) << convention.name << ": " << s.to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LengthsTest, ::testing::ValuesIn(cpu_backends()), backend_label);

class ScheduleTest : public ::testing::TestWithParam<dsa::Backend> {};

std::vector<std::int32_t> random_lens(Rng& rng, std::int64_t batch, int next_n, int pattern) {
  std::uniform_int_distribution<std::int32_t> any(0, 70000);
  std::uniform_int_distribution<std::int32_t> small(0, 600);
  static constexpr std::int32_t kBoundaries[] = {0, 1, 255, 256, 257, 511, 512, 513};
  std::vector<std::int32_t> lens;
  for (std::int64_t i = 0; i < batch * next_n; ++i) {
    switch (pattern) {
      case 0: lens.push_back(any(rng)); break;
      case 1: lens.push_back(small(rng)); break;
      case 2: lens.push_back(kBoundaries[small(rng) % 8]); break;
      default: lens.push_back(0); break;
    }
  }
  return lens;
}

TEST_P(ScheduleTest, CoversEveryItemOnceAndBalances) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  Rng rng(11);
  for (const std::int64_t batch : {0, 1, 7, 33, 128}) {
    for (const int next_n : {1, 2, 3, 4, 8}) {
      for (int pattern = 0; pattern < 4; ++pattern) {
        const std::vector<std::int32_t> lens = random_lens(rng, batch, next_n, pattern);
        for (const int workers : {1, 2, 3, 16, 132, 1000}) {
          for (const dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
            SCOPED_TRACE("batch " + std::to_string(batch) + " next_n " + std::to_string(next_n) + " pattern " +
                         std::to_string(pattern) + " workers " + std::to_string(workers) + " " +
                         dsa::logits_path_name(path));
            Schedule schedule;
            DSA_ASSERT_OK(plan(lens, batch, next_n, workers, path, ctx, &schedule));
            const bool per_token = path == dsa::LogitsPath::per_token;
            const std::string problem =
                check_schedule(schedule.entries.data(), workers, lens, batch, next_n, per_token);
            ASSERT_EQ(problem, "");
            // Balance: a worker's walk costs its items plus, for each unit it enters,
            // 2 where units have at most two rows; none exceeds an equal share of the
            // total weight by more than one unit entry (the one a worker starting
            // inside a unit pays).
            const std::int64_t entry = per_token || next_n <= 2 ? 2 : 0;
            const std::int64_t share = (split_weight(lens, batch, next_n, per_token) + workers - 1) / workers;
            for (const WorkerShare& s : worker_shares(schedule.entries.data(), workers, lens, batch, next_n, per_token)) {
              EXPECT_LE(s.weight, share + entry);
            }
          }
        }
      }
    }
  }
}

TEST_P(ScheduleTest, AutomaticPathPlansForTheResolvedPath) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  Rng rng(12);
  for (const int next_n : {1, 2, 4, 8}) {
    const std::vector<std::int32_t> lens = random_lens(rng, 5, next_n, 1);
    const dsa::LogitsPath resolved = resolved_path(dsa::LogitsPath::automatic, next_n, 64, ctx);
    ASSERT_TRUE(resolved == dsa::LogitsPath::native || resolved == dsa::LogitsPath::per_token);
    Schedule automatic, explicit_path;
    DSA_ASSERT_OK(plan(lens, 5, next_n, 4, dsa::LogitsPath::automatic, ctx, &automatic));
    DSA_ASSERT_OK(plan(lens, 5, next_n, 4, resolved, ctx, &explicit_path));
    EXPECT_EQ(automatic.entries, explicit_path.entries) << "next_n " << next_n;
  }
}

// programmatic_dependent_launch is off by default and concerns CUDA
// launches alone: the CPU backends plan the same schedule with it.
TEST_P(ScheduleTest, ProgrammaticDependentLaunchLeavesCpuPlansAlone) {
  EXPECT_FALSE(dsa::ExecContext{}.programmatic_dependent_launch);
  const dsa::ExecContext plain = cpu_context(GetParam());
  dsa::ExecContext overlapped = plain;
  overlapped.programmatic_dependent_launch = true;
  Rng rng(12);
  const std::vector<std::int32_t> lens = random_lens(rng, 9, 3, 1);
  for (const dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
    Schedule want, got;
    DSA_ASSERT_OK(plan(lens, 9, 3, 7, path, plain, &want));
    DSA_ASSERT_OK(plan(lens, 9, 3, 7, path, overlapped, &got));
    EXPECT_EQ(got.entries, want.entries);
  }
}

// ---- context_lens_and_schedule: the builder then the planner, in one call --

::testing::AssertionResult fails_naming(const dsa::Status& s, dsa::ErrorCode code, const std::string& argument) {
  if (s.code() != code) {
    return ::testing::AssertionFailure() << "expected " << dsa::error_code_name(code) << ", got " << s.to_string();
  }
  if (s.message().find("context_lens_and_schedule") == std::string::npos ||
      s.message().find(argument) == std::string::npos) {
    return ::testing::AssertionFailure() << "message does not name the operation and " << argument << ": "
                                         << s.message();
  }
  return ::testing::AssertionSuccess();
}

constexpr dsa::LengthConvention kConventionValues[] = {dsa::LengthConvention::causal, dsa::LengthConvention::expanded,
                                                       dsa::LengthConvention::legacy};

TEST_P(ScheduleTest, LengthsAndScheduleInOneCallMatchTheFormulasAndThePlan) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  Rng rng(21);
  std::uniform_int_distribution<std::int32_t> length(0, 40000);
  for (int c = 0; c < 3; ++c) {
    for (const std::int64_t batch : {0, 1, 7, 33}) {
      for (const int next_n : {1, 2, 4, 8}) {
        std::vector<std::int32_t> input;
        for (std::int64_t b = 0; b < batch; ++b) input.push_back(b % 5 == 2 ? static_cast<std::int32_t>(b % 3) : length(rng));
        const std::vector<std::int32_t> want_lens = kConventions[c].expected(input, next_n);
        for (const int workers : {1, 5, 132}) {
          for (const dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
            SCOPED_TRACE(std::string(kConventions[c].name) + " batch " + std::to_string(batch) + " next_n " +
                         std::to_string(next_n) + " workers " + std::to_string(workers) + " " +
                         dsa::logits_path_name(path));
            std::vector<std::int32_t> lens(static_cast<std::size_t>(batch * next_n) + 1, -5);
            Schedule schedule;
            schedule.num_workers = workers;
            schedule.entries.assign(static_cast<std::size_t>(2 * (workers + 1)), -7);
            input.reserve(1);
            DSA_ASSERT_OK(dsa::context_lens_and_schedule(kConventionValues[c], view_of(input, {batch}), next_n,
                                                         view_of(lens, {batch, next_n}), workers, path,
                                                         schedule.view(), ctx));
            EXPECT_EQ(lens.back(), -5);
            lens.pop_back();
            ASSERT_EQ(lens, want_lens);
            ASSERT_EQ(check_schedule(schedule.entries.data(), workers, want_lens, batch, next_n,
                                     path == dsa::LogitsPath::per_token),
                      "");
            Schedule separate;
            DSA_ASSERT_OK(plan(want_lens, batch, next_n, workers, path, ctx, &separate));
            EXPECT_EQ(schedule.entries, separate.entries);
          }
        }
      }
    }
  }
}

TEST_P(ScheduleTest, LengthsAndScheduleOfUnevenRequests) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  std::vector<std::int32_t> prefix{10, 5, 0, 3000};
  std::vector<std::int32_t> offsets{0, 2, 2, 21, 22};
  const std::vector<std::int32_t> want_lens{11, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 3001};
  for (const int workers : {1, 3, 40}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    std::vector<std::int32_t> lens(22, -5);
    Schedule schedule;
    schedule.num_workers = workers;
    schedule.entries.assign(static_cast<std::size_t>(2 * (workers + 1)), -7);
    DSA_ASSERT_OK(dsa::context_lens_and_schedule(dsa::LengthConvention::causal, view_of(prefix, {4}), 1,
                                                 view_of(lens, {22}), workers, dsa::LogitsPath::automatic,
                                                 schedule.view(), ctx, view_of(offsets, {5})));
    EXPECT_EQ(lens, want_lens);
    Schedule separate;
    DSA_ASSERT_OK(plan_varlen(want_lens, offsets, workers, dsa::LogitsPath::native, ctx, &separate));
    EXPECT_EQ(schedule.entries, separate.entries);
  }
}

TEST_P(ScheduleTest, LengthsAndScheduleRules) {
  using dsa::ErrorCode;
  const dsa::ExecContext ctx = cpu_context(GetParam());
  std::vector<std::int32_t> prefix{10, 5, 0};
  std::vector<std::int32_t> lens(6, -5);
  std::vector<std::int32_t> entries(10, -7);
  std::vector<std::int32_t> offsets{0, 2, 2, 6};
  const auto call = [&](dsa::LengthConvention convention, const dsa::TensorView& in, int next_n,
                        const dsa::TensorView& out, int workers, const dsa::TensorView& schedule,
                        const dsa::TensorView& request_offsets = {}) {
    return dsa::context_lens_and_schedule(convention, in, next_n, out, workers, dsa::LogitsPath::native, schedule,
                                          ctx, request_offsets);
  };
  const auto causal = dsa::LengthConvention::causal;
  DSA_ASSERT_OK(call(causal, view_of(prefix, {3}), 2, view_of(lens, {3, 2}), 4, view_of(entries, {5, 2})));
  EXPECT_TRUE(fails_naming(call(static_cast<dsa::LengthConvention>(7), view_of(prefix, {3}), 2, view_of(lens, {3, 2}),
                                4, view_of(entries, {5, 2})),
                           ErrorCode::invalid_argument, "convention"));
  EXPECT_TRUE(fails_naming(call(dsa::LengthConvention::expanded, view_of(prefix, {3}), 1, view_of(lens, {6}), 4,
                                view_of(entries, {5, 2}), view_of(offsets, {4})),
                           ErrorCode::invalid_argument, "request_offsets"));
  EXPECT_TRUE(fails_naming(call(causal, view_of(prefix, {3}), 0, view_of(lens, {3, 0}), 4, view_of(entries, {5, 2})),
                           ErrorCode::invalid_argument, "next_n"));
  EXPECT_TRUE(fails_naming(call(causal, view_of(prefix, {3}), 2, view_of(lens, {3, 3}), 4, view_of(entries, {5, 2})),
                           ErrorCode::bad_shape, "context_lens"));
  EXPECT_TRUE(fails_naming(call(causal, view_of(prefix, {3}), 2, view_of(lens, {3, 2}), 0, view_of(entries, {1, 2})),
                           ErrorCode::invalid_argument, "num_workers"));
  EXPECT_TRUE(fails_naming(call(causal, view_of(prefix, {3}), 2, view_of(lens, {3, 2}), 4, view_of(entries, {4, 2})),
                           ErrorCode::bad_shape, "schedule"));
  // The schedule written over the lengths it plans from.
  std::vector<std::int32_t> shared(16, -7);
  const dsa::TensorView shared_lens = dsa::make_view(shared.data(), dsa::DType::int32, {3, 2});
  const dsa::TensorView shared_schedule = dsa::make_view(shared.data() + 4, dsa::DType::int32, {5, 2});
  EXPECT_TRUE(fails_naming(call(causal, view_of(prefix, {3}), 2, shared_lens, 4, shared_schedule),
                           ErrorCode::invalid_argument, "schedule"));
  const dsa::TensorView apart_schedule = dsa::make_view(shared.data() + 6, dsa::DType::int32, {5, 2});
  DSA_ASSERT_OK(call(causal, view_of(prefix, {3}), 2, shared_lens, 4, apart_schedule));
  // Data rules: a negative length and offsets that do not cover the rows, before anything is written.
  std::vector<std::int32_t> negative{10, -1, 0};
  std::fill(lens.begin(), lens.end(), -5);
  std::fill(entries.begin(), entries.end(), -7);
  EXPECT_TRUE(fails_naming(call(causal, view_of(negative, {3}), 2, view_of(lens, {3, 2}), 4, view_of(entries, {5, 2})),
                           ErrorCode::invalid_argument, "prefix_lens"));
  std::vector<std::int32_t> short_offsets{0, 2, 2, 5};
  EXPECT_TRUE(fails_naming(call(causal, view_of(prefix, {3}), 1, view_of(lens, {6}), 4, view_of(entries, {5, 2}),
                                view_of(short_offsets, {4})),
                           ErrorCode::invalid_argument, "request_offsets"));
  EXPECT_EQ(lens, std::vector<std::int32_t>(6, -5));
  EXPECT_EQ(entries, std::vector<std::int32_t>(10, -7));
}

TEST(ScheduleQueries, PathsResolveToThemselvesAndWorkersFollowThreads) {
  for (const dsa::Backend backend : cpu_backends()) {
    const dsa::ExecContext ctx = cpu_context(backend, 3);
    for (const int next_n : {1, 2, 5, 8}) {
      EXPECT_EQ(resolved_path(dsa::LogitsPath::native, next_n, 64, ctx), dsa::LogitsPath::native);
      EXPECT_EQ(resolved_path(dsa::LogitsPath::per_token, next_n, 32, ctx), dsa::LogitsPath::per_token);
      EXPECT_NE(resolved_path(dsa::LogitsPath::automatic, next_n, 64, ctx), dsa::LogitsPath::automatic);
    }
    EXPECT_GE(dsa::default_num_workers(dsa::Device{}, ctx), 1);
  }
  EXPECT_EQ(dsa::default_num_workers(dsa::Device{}, cpu_context(dsa::Backend::cpu, 3)), 3);
  EXPECT_EQ(dsa::default_num_workers(dsa::Device{}, cpu_context(dsa::Backend::cpu, 7)), 7);
}

INSTANTIATE_TEST_SUITE_P(Backends, ScheduleTest, ::testing::ValuesIn(cpu_backends()), backend_label);

}  // namespace
}  // namespace dsa_test
