// The default command: build a workload, run the pipeline on one backend,
// verify it against the float64 CPU reference and time every stage.
#pragma once

#include <string>

#include "dsa/context.hpp"
#include "dsa/tensor.hpp"
#include "options.hpp"

namespace dsa_cli {

// Where a command runs: the backend for ExecContext and the device its
// tensors live on.
struct Target {
  dsa::Backend backend = dsa::Backend::cpu;
  dsa::Device device{};
  bool on_gpu() const { return device.type == dsa::DeviceType::cuda; }
};

// Resolves --backend against the devices present; false with *error set when
// the choice needs a CUDA device that is not there.
bool resolve_target(BackendChoice choice, Target* target, std::string* error);

// One line describing the device ("NVIDIA H200 (sm_90, 132 SMs)" or the CPU).
std::string describe_device(const Target& target);

// Returns the process exit code: 0 verified, 1 failed or errored.
int run_command(const Options& options);

}  // namespace dsa_cli
