// Conversions between Python objects and the library's argument types:
// DLPack arrays -> dsa::TensorView (no copies), workspace arrays -> aligned
// dsa::Workspace, and non-ok dsa::Status -> Python exceptions.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>

#include "dsa/dsa.hpp"

namespace dsa::python {

namespace nb = nanobind;

// Inputs may be read-only (the library never writes them); outputs must be writable.
using InputArray = nb::ndarray<nb::ro>;
using OutputArray = nb::ndarray<>;
using OptionalInput = std::optional<InputArray>;
using OptionalOutput = std::optional<OutputArray>;

// How an argument that holds fp8 values reads a uint8 array. NumPy and CuPy
// have no fp8 type, and DLPack exporters that predate its float8 codes cannot
// describe one, so fp8 arguments also take the raw e4m3 bytes as uint8.
enum class Uint8Meaning { bytes, float8_e4m3 };

// A view of the array's memory with its dtype, shape, strides and device.
// Raises ValueError naming `argument` for a rank above 4, a dtype or device
// the library has no name for.
TensorView to_view(const InputArray& array, const char* argument,
                   Uint8Meaning uint8_meaning = Uint8Meaning::bytes);
TensorView to_view(const OutputArray& array, const char* argument,
                   Uint8Meaning uint8_meaning = Uint8Meaning::bytes);
// An absent optional argument is the empty view.
TensorView to_view(const OptionalInput& array, const char* argument);

// ctx with its workspace set from a 1-D contiguous byte array (absent: no
// workspace). The pointer is advanced to kWorkspaceAlignment, so callers
// allocate the queried size plus kWorkspaceAlignment bytes.
ExecContext with_workspace(const ExecContext& ctx, const OptionalOutput& workspace);

// Raises the Python exception for a non-ok status: ValueError for argument
// errors, NotImplementedError for `unsupported`, RuntimeError for CUDA and
// internal errors. The message is status.to_string(): "<code>: <op>: <argument>: <rule>".
void raise_if_error(const Status& status);

// Runs a library call without the GIL and raises on a non-ok status.
template <typename Call>
void run_released(Call&& call) {
  Status status;
  {
    nb::gil_scoped_release release;
    status = call();
  }
  raise_if_error(status);
}

}  // namespace dsa::python
