// dsa-indexer: run and verify the index-selection pipeline or prefill scoring, or benchmark them.
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "bench.hpp"
#include "options.hpp"
#include "prefill.hpp"
#include "run.hpp"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const dsa_cli::ParseResult parsed = dsa_cli::parse_options(args);
  if (!parsed.error.empty()) {
    std::fprintf(stderr, "dsa-indexer: %s\nRun 'dsa-indexer --help' for usage.\n", parsed.error.c_str());
    return 2;
  }
  // Host buffers are sized by --batch and --context: running out of memory is
  // reported like any other error instead of aborting.
  try {
    switch (parsed.options.command) {
      case dsa_cli::Command::help:
        std::fputs(dsa_cli::usage_text().c_str(), stdout);
        return 0;
      case dsa_cli::Command::bench:
        return dsa_cli::bench_command(parsed.options);
      case dsa_cli::Command::prefill:
        return dsa_cli::prefill_command(parsed.options);
      case dsa_cli::Command::run:
        break;
    }
    return dsa_cli::run_command(parsed.options);
  } catch (const std::bad_alloc&) {
    std::fputs(parsed.options.command == dsa_cli::Command::prefill
                   ? "dsa-indexer: error: out of host memory for this workload; lower --seq or --prefix\n"
                   : "dsa-indexer: error: out of host memory for this workload; lower --batch or --context\n",
               stderr);
    return 1;
  }
}
