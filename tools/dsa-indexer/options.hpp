// Command-line options of dsa-indexer and their parsing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsa/cache.hpp"
#include "dsa/schedule.hpp"

namespace dsa_cli {

enum class Command { run, bench, prefill, help };

// What --backend asks for; `automatic` means a GPU when one is present, else
// the multithreaded CPU backend.
enum class BackendChoice { automatic, cpu, cpu_reference, cuda, cuda_generic, cuda_hopper };

const char* backend_choice_name(BackendChoice choice) noexcept;

enum class GridSize { full, small, topk, prefill };

const char* grid_size_name(GridSize size) noexcept;

struct Options {
  Command command = Command::run;
  BackendChoice backend = BackendChoice::automatic;
  // Unset sizes take defaults that depend on where the run happens (see
  // default_batch / default_context in workload.hpp).
  std::optional<std::int64_t> batch;
  std::optional<std::int64_t> context;
  int next_n = 2;
  double spread = 0.3;
  int k = 2048;
  int heads = 64;
  int page_size = dsa::kDefaultPageTokens;  // tokens per cache page: 32 or 64
  // fp8_e4m3, or fp4_e2m1: fp4 keys and fp4 queries (DeepSeek-V4.1's indexer format).
  dsa::KeyFormat key_format = dsa::KeyFormat::fp8_e4m3;
  // The queries' format: fp8 or fp4 (automatic: the keys').
  dsa::KeyFormat query_format = dsa::KeyFormat::automatic;
  dsa::KeyFormat resolved_query_format() const {
    return query_format == dsa::KeyFormat::automatic ? key_format : query_format;
  }
  dsa::LogitsPath path = dsa::LogitsPath::automatic;
  std::uint64_t seed = 1;
  // Timed repetitions per measurement; unset: a few on the CPU, many on a GPU.
  std::optional<int> iters;
  // Largest max relative logits error that passes; unset: per backend default.
  std::optional<double> tolerance;
  GridSize grid = GridSize::full;
  // prefill: S new tokens over a prefix of P keys (unset: per-device defaults,
  // see prefill.cpp), and the compressed output form.
  std::optional<std::int64_t> seq;
  std::optional<std::int64_t> prefix;
  bool compressed = false;
  bool json = false;
  std::string json_file;  // empty with json: standard output
};

struct ParseResult {
  Options options;
  std::string error;  // non-empty: a usage error naming the flag and the rule
};

ParseResult parse_options(const std::vector<std::string>& args);

// The --help text.
std::string usage_text();

}  // namespace dsa_cli
