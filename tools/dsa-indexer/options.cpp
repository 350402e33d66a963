#include "options.hpp"

#include <charconv>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string_view>

#include "dsa/cache.hpp"

namespace dsa_cli {
namespace {

constexpr std::int64_t kMaxBatch = 16384;
constexpr std::int64_t kMaxContext = 1 << 22;  // keeps every length and slot in int32
constexpr int kMaxNextN = 8;
constexpr int kMaxHeads = 256;
constexpr int kMaxIters = 100000;
constexpr std::int64_t kMaxSeq = 131072;
constexpr std::int64_t kMaxPrefix = 1 << 22;

std::optional<std::int64_t> parse_integer(std::string_view text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<double> parse_real(std::string_view text) {
  if (text.empty()) return std::nullopt;
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size()) return std::nullopt;
  return value;
}

// Parses `value` of `flag` as an integer in [low, high] into *out, or
// returns the usage error.
std::string integer_in_range(const std::string& flag, std::string_view value, std::int64_t low,
                             std::int64_t high, std::int64_t* out) {
  const auto parsed = parse_integer(value);
  if (!parsed || *parsed < low || *parsed > high) {
    return flag + ": expected an integer in [" + std::to_string(low) + ", " +
           std::to_string(high) + "], got '" + std::string(value) + "'";
  }
  *out = *parsed;
  return {};
}

template <typename Enum>
std::string one_of(const std::string& flag, std::string_view value,
                   std::initializer_list<std::pair<const char*, Enum>> choices, Enum* out) {
  std::string names;
  for (const auto& [name, choice] : choices) {
    if (value == name) {
      *out = choice;
      return {};
    }
    names += names.empty() ? "" : ", ";
    names += name;
  }
  return flag + ": expected one of " + names + ", got '" + std::string(value) + "'";
}

struct Flag {
  const char* name;
  bool for_run;
  bool for_bench;
  bool for_prefill;
  std::function<std::string(std::string_view value, Options& options)> apply;
};

std::vector<Flag> flag_table() {
  using L = std::int64_t;
  return {
      {"--backend", true, true, true,
       [](std::string_view v, Options& o) {
         return one_of<BackendChoice>("--backend", v,
                                      {{"auto", BackendChoice::automatic},
                                       {"cpu", BackendChoice::cpu},
                                       {"cpu-reference", BackendChoice::cpu_reference},
                                       {"cuda", BackendChoice::cuda},
                                       {"cuda-generic", BackendChoice::cuda_generic},
                                       {"cuda-hopper", BackendChoice::cuda_hopper}},
                                      &o.backend);
       }},
      {"--batch", true, false, false,
       [](std::string_view v, Options& o) {
         L value = 0;
         std::string error = integer_in_range("--batch", v, 1, kMaxBatch, &value);
         if (error.empty()) o.batch = value;
         return error;
       }},
      {"--context", true, false, false,
       [](std::string_view v, Options& o) {
         L value = 0;
         std::string error = integer_in_range("--context", v, 1, kMaxContext, &value);
         if (error.empty()) o.context = value;
         return error;
       }},
      {"--next-n", true, false, false,
       [](std::string_view v, Options& o) {
         L value = 0;
         std::string error = integer_in_range("--next-n", v, 1, kMaxNextN, &value);
         o.next_n = static_cast<int>(value);
         return error;
       }},
      {"--spread", true, false, false,
       [](std::string_view v, Options& o) -> std::string {
         const auto value = parse_real(v);
         if (!value || !(*value >= 0.0 && *value < 1.0)) {
           return "--spread: expected a fraction in [0, 1) (0.3 means +-30%), got '" +
                  std::string(v) + "'";
         }
         o.spread = *value == 0.0 ? 0.0 : *value;  // -0 would print as "+--0%"
         return {};
       }},
      {"--k", true, true, true,
       [](std::string_view v, Options& o) {
         L value = 0;
         std::string error = integer_in_range("--k", v, 1, 2048, &value);
         o.k = static_cast<int>(value);
         return error;
       }},
      {"--heads", true, true, true,
       [](std::string_view v, Options& o) {
         L value = 0;
         std::string error = integer_in_range("--heads", v, 1, kMaxHeads, &value);
         o.heads = static_cast<int>(value);
         return error;
       }},
      {"--page-size", true, true, false,
       [](std::string_view v, Options& o) -> std::string {
         const auto value = parse_integer(v);
         if (!value || !dsa::supported_page_size(*value)) {
           return "--page-size: expected 32 or 64 (tokens per cache page), got '" + std::string(v) + "'";
         }
         o.page_size = static_cast<int>(*value);
         return {};
       }},
      {"--key-format", true, true, true,
       [](std::string_view v, Options& o) {
         return one_of<dsa::KeyFormat>("--key-format", v,
                                       {{"fp8", dsa::KeyFormat::fp8_e4m3}, {"fp4", dsa::KeyFormat::fp4_e2m1}},
                                       &o.key_format);
       }},
      {"--query-format", true, true, true,
       [](std::string_view v, Options& o) {
         return one_of<dsa::KeyFormat>("--query-format", v,
                                       {{"fp8", dsa::KeyFormat::fp8_e4m3}, {"fp4", dsa::KeyFormat::fp4_e2m1}},
                                       &o.query_format);
       }},
      {"--path", true, false, false,
       [](std::string_view v, Options& o) {
         return one_of<dsa::LogitsPath>("--path", v,
                                        {{"auto", dsa::LogitsPath::automatic},
                                         {"native", dsa::LogitsPath::native},
                                         {"per-token", dsa::LogitsPath::per_token}},
                                        &o.path);
       }},
      {"--seed", true, true, true,
       [](std::string_view v, Options& o) {
         L value = 0;
         std::string error =
             integer_in_range("--seed", v, 0, std::numeric_limits<L>::max(), &value);
         o.seed = static_cast<std::uint64_t>(value);
         return error;
       }},
      {"--iters", true, true, true,
       [](std::string_view v, Options& o) {
         L value = 0;
         std::string error = integer_in_range("--iters", v, 1, kMaxIters, &value);
         if (error.empty()) o.iters = static_cast<int>(value);
         return error;
       }},
      {"--tolerance", true, false, true,
       [](std::string_view v, Options& o) -> std::string {
         const auto value = parse_real(v);
         if (!value || !(*value > 0.0 && *value < 1.0)) {
           return "--tolerance: expected a relative error in (0, 1), got '" + std::string(v) +
                  "'";
         }
         o.tolerance = *value;
         return {};
       }},
      {"--seq", false, false, true,
       [](std::string_view v, Options& o) {
         L value = 0;
         std::string error = integer_in_range("--seq", v, 1, kMaxSeq, &value);
         if (error.empty()) o.seq = value;
         return error;
       }},
      {"--prefix", false, false, true,
       [](std::string_view v, Options& o) {
         L value = 0;
         std::string error = integer_in_range("--prefix", v, 0, kMaxPrefix, &value);
         if (error.empty()) o.prefix = value;
         return error;
       }},
      {"--grid", false, true, false,
       [](std::string_view v, Options& o) {
         return one_of<GridSize>("--grid", v,
                                 {{"full", GridSize::full},
                                  {"small", GridSize::small},
                                  {"topk", GridSize::topk},
                                  {"prefill", GridSize::prefill}},
                                 &o.grid);
       }},
  };
}

const char* command_name(Command command) {
  switch (command) {
    case Command::bench: return "bench";
    case Command::prefill: return "prefill";
    default: return "the default run";
  }
}

bool allowed_in(const Flag& flag, Command command) {
  switch (command) {
    case Command::bench: return flag.for_bench;
    case Command::prefill: return flag.for_prefill;
    default: return flag.for_run;
  }
}

}  // namespace

const char* backend_choice_name(BackendChoice choice) noexcept {
  switch (choice) {
    case BackendChoice::automatic: return "auto";
    case BackendChoice::cpu: return "cpu";
    case BackendChoice::cpu_reference: return "cpu-reference";
    case BackendChoice::cuda: return "cuda";
    case BackendChoice::cuda_generic: return "cuda-generic";
    case BackendChoice::cuda_hopper: return "cuda-hopper";
  }
  return "?";
}

const char* grid_size_name(GridSize size) noexcept {
  switch (size) {
    case GridSize::full: return "full";
    case GridSize::small: return "small";
    case GridSize::topk: return "topk";
    case GridSize::prefill: return "prefill";
  }
  return "?";
}

ParseResult parse_options(const std::vector<std::string>& args) {
  ParseResult result;
  Options& options = result.options;
  std::size_t next = 0;
  if (!args.empty() && !args[0].starts_with("-")) {
    if (args[0] == "bench") {
      options.command = Command::bench;
    } else if (args[0] == "prefill") {
      options.command = Command::prefill;
    } else if (args[0] == "run") {
      options.command = Command::run;
    } else if (args[0] == "help") {
      options.command = Command::help;
      return result;
    } else {
      result.error = "unknown command '" + args[0] + "' (expected run, bench, prefill or help)";
      return result;
    }
    next = 1;
  }

  const std::vector<Flag> flags = flag_table();
  while (next < args.size()) {
    const std::string& arg = args[next++];
    if (arg == "--help" || arg == "-h") {
      options.command = Command::help;
      return result;
    }
    if (arg == "--json" || arg.starts_with("--json=")) {
      options.json = true;
      if (arg.size() > 7) {
        options.json_file = arg.substr(7);
      } else if (next < args.size() && !args[next].starts_with("-")) {
        options.json_file = args[next++];
      }
      if (options.json_file == "-") options.json_file.clear();
      continue;
    }
    if (arg == "--compressed") {
      if (options.command != Command::prefill) {
        result.error = std::string("--compressed: not an option of ") + command_name(options.command) +
                       " (only for the prefill command)";
        return result;
      }
      options.compressed = true;
      continue;
    }
    const std::size_t equals = arg.find('=');
    const std::string name = arg.substr(0, equals);
    const Flag* flag = nullptr;
    for (const Flag& candidate : flags) {
      if (name == candidate.name) flag = &candidate;
    }
    if (flag == nullptr) {
      result.error = arg.starts_with("-") ? "unknown option '" + name + "'"
                                          : "unexpected argument '" + arg +
                                                "' (the command must come first)";
      return result;
    }
    if (!allowed_in(*flag, options.command)) {
      std::string hint;
      if (options.command == Command::bench) {
        hint = " (the reference grid fixes it; see --grid)";
      } else if (flag->for_prefill && !flag->for_run && !flag->for_bench) {
        hint = " (only for the prefill command)";
      } else if (flag->for_bench && !flag->for_run) {
        hint = " (only for the bench command)";
      }
      result.error = name + ": not an option of " + command_name(options.command) + hint;
      return result;
    }
    std::string value;
    if (equals != std::string::npos) {
      value = arg.substr(equals + 1);
    } else if (next < args.size()) {
      value = args[next++];
    } else {
      result.error = name + ": missing value";
      return result;
    }
    result.error = flag->apply(value, options);
    if (!result.error.empty()) return result;
  }
  return result;
}

std::string usage_text() {
  return R"(dsa-indexer: index selection for DeepSeek Sparse Attention (lightning indexer + top-k)

Usage:
  dsa-indexer [run] [options]     build a DeepSeek-V3.2-shaped workload, run the whole
                                  pipeline on one backend, verify it against the float64
                                  CPU reference and time every stage
  dsa-indexer bench [options]     GPU: measure copy bandwidth and the fp8 matrix rate,
                                  then time the reference grid (or --grid prefill) against
                                  its floor
  dsa-indexer prefill [options]   build a causal prefill workload, score it with mqa_logits
                                  and take the ragged top-k on one backend, verify both
                                  against the float64 CPU reference and time them
  dsa-indexer --help

Pipeline of the default run: store_index_keys (bf16 keys -> fp8 paged cache),
quantize_queries (bf16 q + raw head gate), context_lens_and_schedule (causal
lengths and the schedule in one call), paged_mqa_logits, topk, index_topk. Exit
status: 0 when verification passes, 1 when it fails or an operation reports an
error, 2 on a usage error.

Options of the default run:
  --backend B     auto | cpu | cpu-reference | cuda | cuda-generic | cuda-hopper
                  (default auto: a CUDA device when present, else the multithreaded CPU)
  --batch N       requests B, 1..16384 (default 4 on the CPU, 32 on a GPU)
  --context N     average context length, 1..4194304 (default 4096 on the CPU, 32768 on a GPU)
  --spread F      lengths uniform in +-F around the average, 0 <= F < 1 (default 0.3)
  --next-n N      draft tokens per request, 1..8 (default 2)
  --heads N       indexer heads H, 1..256 (default 64; the Hopper kernels serve 32 and 64)
  --page-size P   tokens per cache page, 32 or 64 (default 64)
  --key-format F  fp8 | fp4: the index-key and query format (default fp8; fp4 is
                  DeepSeek-V4.1's: e2m1 keys and queries with ue8m0 block scales, 68-byte
                  tokens; on Hopper GPUs the sm_90a kernels read fp4 keys with fp4
                  or fp8 queries)
  --query-format F  fp8 | fp4: the queries alone (default: the key format), e.g. fp8
                  queries over an fp4 cache as DeepGEMM's fp8_fp4 names take them (on
                  Hopper GPUs the sm_90a kernels read that mix)
  --k N           top-k, 1..2048 (default 2048)
  --path P        auto | native | per-token: how the logits kernel reads the cache
  --seed N        random seed of the workload (default 1)
  --iters N       timed repetitions per stage (default 3 on the CPU, 100 on a GPU)
  --tolerance F   largest max relative logits error that passes
                  (default 1e-4 on the CPU, 1e-2 on a GPU)
  --json[=FILE]   machine-readable report to FILE, or to standard output when no FILE is
                  given ('--json FILE' works too); the text report then goes to stderr

Options of bench:
  --backend B     as above (default auto)
  --grid G        full: B in {32, 128} x average context {8K, 32K, 64K} x next_n 1..4;
                  small: B in {1, 4, 8, 16} at 4K and 16K, B=32 at 8K and B=128 at 64K,
                  next_n 1..4; topk: only the top-k lines;
                  prefill: mqa_logits over causal prefill chunks, H in {64, 32} x
                  S in {512, 4K, 16K} new tokens x prefix P in {0, 32K, 96K}, against the
                  fp8 tensor-core rate, and the ragged top-k of S=4K over P=32K (--heads
                  does not apply; --key-format, --query-format and --page-size do)
                  (default full)
  --heads N, --page-size P, --key-format F, --query-format F, --k N, --seed N
  --iters N       timed repetitions per measurement (default 50)
  --json[=FILE]   everything measured, as JSON; the table is printed at the end
  Without a CUDA device, bench says the grid needs a GPU, times one small point on the
  CPU backend (no floor: the rates it needs are GPU measurements) and exits 0.

Options of prefill (S new tokens over a prefix of P keys; row i scores keys
[0, P + i + 1) of the S_kv = P + S keys):
  --seq N         new tokens S, 1..131072 (default 256 on the CPU, 512 on a GPU)
  --prefix N      prefix P, 0..4194304 (default 1024 on the CPU, 8192 on a GPU)
  --compressed    the compressed output form (column c of row i holds key ks[i] + c)
  --backend B, --heads N, --key-format F, --query-format F, --k N, --seed N, --iters N,
  --tolerance F, --json[=FILE]   as for the default run

Lengths are causal (row j of request b sees prefix_b + j + 1 positions), pages are
randomly permuted, H x D = heads x 128, page size 64 unless --page-size says 32.
See docs/cli.md.
)";
}

}  // namespace dsa_cli
