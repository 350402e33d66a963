"""The array frameworks dsa_indexer works with: NumPy, PyTorch and CuPy.

Everything that depends on which framework an argument comes from lives here:
handing arrays to the extension without copies, allocating outputs and
workspaces in the caller's framework on the caller's device, and the default
CUDA stream of that framework. PyTorch and CuPy are only looked up when the
caller already imported them (an argument from them cannot exist otherwise).
"""

import sys
import warnings

import numpy as np

from . import _core

NUMPY = "numpy"
TORCH = "torch"
CUPY = "cupy"

# Element types by the names the library uses.
_NUMPY_DTYPES = {
    "uint8": np.uint8,
    "int32": np.int32,
    "int64": np.int64,
    "float32": np.float32,
    # NumPy has no fp8 type: fp8 arrays hold the raw e4m3fn bytes.
    "float8_e4m3": np.uint8,
}


def framework_of(array):
    """Name of the framework `array` belongs to (TypeError for anything else)."""
    module = type(array).__module__
    if module.startswith("torch"):
        return TORCH
    if module.startswith("cupy"):
        return CUPY
    if isinstance(array, np.ndarray):
        return NUMPY
    raise TypeError(
        f"expected a NumPy array, PyTorch tensor or CuPy array, got {type(array).__name__}"
    )


def is_writable(array):
    """False for a read-only NumPy array (the frameworks' other arrays are writable)."""
    return not isinstance(array, np.ndarray) or array.flags.writeable


def _torch():
    return sys.modules["torch"]


def _cupy():
    return sys.modules["cupy"]


def export(array):
    """An object the extension reads in place (via DLPack or the buffer protocol).

    PyTorch tensors go through torch.utils.dlpack.to_dlpack, which neither
    synchronizes streams nor records events (safe during CUDA-graph capture);
    fp8 tensors are exported as their uint8 bytes, which the extension reads
    as e4m3fn for fp8 arguments (not every PyTorch release exports float8
    through DLPack). CuPy arrays go through toDlpack for the same reason.
    None stays None (an absent optional argument).
    """
    if array is None:
        return None
    module = type(array).__module__
    if module.startswith("torch"):
        torch = _torch()
        if array.dtype == torch.float8_e4m3fn:
            array = array.view(torch.uint8)
        if array.requires_grad:
            array = array.detach()
        return torch.utils.dlpack.to_dlpack(array)
    if module.startswith("cupy"):
        # toDlpack exports without touching streams; the protocol's
        # __dlpack__ would order the export against a consumer stream, which
        # CUDA-graph capture forbids. CuPy marks toDlpack deprecated, so its
        # warning is silenced for this one call.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return array.toDlpack()
    return array


def device_of(array):
    """(_core.DeviceType, index) of the memory behind `array`."""
    framework = framework_of(array)
    if framework == TORCH:
        device = array.device
        if device.type == "cuda":
            index = device.index if device.index is not None else _torch().cuda.current_device()
            return _core.DeviceType.cuda, index
        return _core.DeviceType.cpu, 0
    if framework == CUPY:
        return _core.DeviceType.cuda, array.device.id
    return _core.DeviceType.cpu, 0


def current_stream(array):
    """The framework's current CUDA stream for `array`'s device as an integer (0 on the CPU)."""
    framework = framework_of(array)
    if framework == TORCH and array.device.type == "cuda":
        return _torch().cuda.current_stream(array.device).cuda_stream
    if framework == CUPY:
        with array.device:
            return _cupy().cuda.get_current_stream().ptr
    return 0


def current_cuda_device():
    """The current CUDA device of the frameworks loaded (PyTorch's, else CuPy's), else 0."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return cupy.cuda.Device().id
    return 0


def empty(like, shape, dtype):
    """An uninitialized array of `dtype` (a library dtype name) in `like`'s framework and device."""
    framework = framework_of(like)
    if framework == TORCH:
        torch = _torch()
        torch_dtypes = {
            "uint8": torch.uint8,
            "int32": torch.int32,
            "int64": torch.int64,
            "float32": torch.float32,
            "bfloat16": torch.bfloat16,
            "float8_e4m3": torch.float8_e4m3fn,
        }
        # Extents stay as given: symbolic when a fake implementation allocates under
        # torch.compile (int() would specialize them).
        return torch.empty(tuple(shape), dtype=torch_dtypes[dtype], device=like.device)
    shape = tuple(int(extent) for extent in shape)
    if dtype not in _NUMPY_DTYPES:
        raise TypeError(f"{framework} has no {dtype} arrays; pass a preallocated output")
    if framework == CUPY:
        with like.device:
            return _cupy().empty(shape, dtype=_NUMPY_DTYPES[dtype])
    return np.empty(shape, dtype=_NUMPY_DTYPES[dtype])


def workspace(like, nbytes):
    """Scratch memory of `nbytes` on `like`'s device, or None when nbytes is 0.

    The buffer is over-allocated by the workspace alignment; the extension
    aligns the pointer itself.
    """
    if nbytes == 0:
        return None
    return empty(like, (nbytes + _core.workspace_alignment(),), "uint8")


def request_offsets(request_ids, requests):
    """int32 [requests + 1]: entry b counts the rows whose request id (request_ids, a 1-D
    integer array, non-decreasing) is below b, computed on the array's device without a host
    synchronization (one searchsorted), so that CUDA graphs can capture it. For ids within
    [0, requests) these are the rows' request_offsets; other ids leave the last entry short
    of the rows, which the library reports."""
    if framework_of(request_ids) == TORCH:
        torch = _torch()
        bounds = torch.arange(requests + 1, device=request_ids.device, dtype=request_ids.dtype)
        return torch.searchsorted(request_ids.contiguous(), bounds, out_int32=True)
    xp = _cupy() if framework_of(request_ids) == CUPY else np
    bounds = xp.arange(requests + 1, dtype=request_ids.dtype)
    return xp.searchsorted(request_ids, bounds).astype(xp.int32)


def rows_at(array, positions):
    """array[positions] along dimension 0 (positions a 1-D integer array of the same
    framework and device), without a host synchronization."""
    if framework_of(array) == TORCH:
        return array.index_select(0, positions.to(_torch().int64))
    return array[positions]


def dense_request_ids(request_ids):
    """The ids of non-decreasing request_ids renumbered 0, 1, 2, ... in order of first
    appearance (int32, same device, no host synchronization): the same rows share an id,
    and every id is below the number of rows."""
    if framework_of(request_ids) == TORCH:
        torch = _torch()
        changes = (request_ids[1:] != request_ids[:-1]).to(torch.int32)
        first = torch.zeros(min(request_ids.shape[0], 1), dtype=torch.int32, device=request_ids.device)
        return torch.cat([first, torch.cumsum(changes, 0, dtype=torch.int32)])
    xp = _cupy() if framework_of(request_ids) == CUPY else np
    changes = (request_ids[1:] != request_ids[:-1]).astype(xp.int32)
    first = xp.zeros(min(request_ids.shape[0], 1), dtype=xp.int32)
    return xp.concatenate([first, xp.cumsum(changes, dtype=xp.int32)])
