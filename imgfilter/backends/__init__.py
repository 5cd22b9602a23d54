"""Backends: the engines behind the array API, picked by name.

A backend is a module object exposing:

    NAME: str                              "cuda" or "cpu"
    correlate(img, kernel, anchor, border, value, method) -> out
    box(img, ksize, anchor, border, value, method) -> out
    contour(img, border, value, method) -> out

Contract shared by every backend (the array API validates before calling):
- `img` is 3-D (H, W, C), C in {1, 3, 4}, dtype uint8, uint16 or float32, C-contiguous.
  The CUDA backend also takes device arrays (`__cuda_array_interface__`) and then
  returns a Numba device array; host arrays come back as host arrays.
- `kernel` is a 2-D float32 host array (kh, kw); `ksize` is (kh, kw) for a box.
- `anchor` is (ay, ax), the kernel cell placed on the output pixel (OpenCV's anchor,
  already resolved: (kh // 2, kw // 2) for the default).
- `border` is a code from `kernels.common.border_index`; `value` the constant-border value.
- `out` has the dtype and shape of `img` (contour: (H, W) of img's dtype, uint8 or
  uint16), rounded half-to-even and saturated for integer dtypes, as cv2.filter2D does.
- `method` names a CUDA variant ("auto", "naive", "padded", "tiled", "window", "blocked",
  "separable"); the CPU backend has one implementation and ignores it.
"""

from __future__ import annotations

import functools
import os
import sys
from types import ModuleType
from typing import Any

from ..errors import DeviceError, UsageError

BACKENDS = ("auto", "cuda", "cpu")
_warned_fallback = False
_device_backend: list = []  # the cuda module, once device arrays have been given to it


@functools.cache
def _cuda_problem() -> str | None:
    """Why the CUDA backend cannot run here, or None when it can (asked once)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return None
    problem = _driver_problem()
    if problem is not None:  # known without importing Numba's CUDA target (0.4 s)
        return problem
    return None if _kernels_ship() else compiler_problem()


@functools.cache
def compiler_problem() -> str | None:
    """Why kernels cannot be compiled here (no CUDA compiler libraries), or None."""
    if nvvm_file() is not None:
        return None
    try:  # not where the wheels and toolkits put it: let Numba search (slower) and load it
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception:
        return (
            "a GPU is present but the CUDA compiler libraries (NVVM) are missing; "
            "install them with: pip install 'imgfilter[cu12]' (or [cu13] for CUDA 13 drivers)"
        )
    return None


def _kernels_ship() -> bool:
    """Whether the package's shipped kernels run on this GPU (no compiler needed for
    them)."""
    from kernels.common import shipped
    from kernels.common.cudadrv import driver

    return shipped.ships_for(driver().cc)


def _driver_problem() -> str | None:
    """Why the NVIDIA driver gives no GPU (no libcuda, cuInit fails, no memory for a
    context), asked through `kernels.common.cudadrv` alone; None when one answers."""
    from kernels.common.cudadrv import CudaError, NoMemoryForContext, driver

    try:
        driver()
    except NoMemoryForContext as exc:
        return str(exc)
    except CudaError:
        return "no usable NVIDIA GPU was found"
    return None


# Where NVIDIA's wheels (below a site-packages directory) and CUDA toolkits (below
# their root) put libnvvm, as cuda.pathfinder looks for it.
_NVVM_IN_SITE_PACKAGES = ("nvidia/cu13/lib", "nvidia/cuda_nvcc/nvvm/lib64")
_NVVM_IN_TOOLKIT = ("nvvm/lib64",)
_TOOLKIT_ROOTS = ("/usr/local/cuda", "/opt/cuda")
_TOOLKIT_VERSIONS = "/usr/local/cuda-*"  # newest first


def nvvm_file() -> str | None:
    """The path of a libnvvm shared library found in the usual places (NVIDIA's pip
    wheels on sys.path, $CUDA_HOME, $CUDA_PATH, $CONDA_PREFIX, /usr/local/cuda), or None.
    A look at the file system only: loading NVVM to see whether it is there (what
    Numba's own search does, which may start a subprocess) costs 0.6-1.3 s of every
    process's start, and a process that runs only shipped kernels never needs it."""
    import glob

    dirs = [os.path.join(base, sub) for base in sys.path if base
            for sub in _NVVM_IN_SITE_PACKAGES]  # fmt: skip
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX")]
    roots += [*_TOOLKIT_ROOTS, *sorted(glob.glob(_TOOLKIT_VERSIONS), reverse=True)]
    dirs += [os.path.join(root, sub) for root in roots if root for sub in _NVVM_IN_TOOLKIT]
    for directory in dirs:
        found = sorted(glob.glob(os.path.join(directory, "libnvvm.so*")))
        if found:
            return found[0]
    return None


def get_backend(name: str = "auto", *, device_input: bool = False) -> Any:
    """Return the backend module for `name` in BACKENDS.

    "auto" picks cuda when a GPU answers and its kernels can run (they ship for it, or
    the CUDA compiler libraries are installed), else cpu, saying so once on stderr.
    Under the CUDA simulator, "auto" picks cpu (the simulator is for tests) unless the
    input is already a device array. "cuda" without a usable GPU raises DeviceError.
    The CUDA backend imports Numba only where a kernel must be compiled.
    """
    if device_input and name in ("auto", "cuda") and _device_backend:
        return _device_backend[0]
    name = str(name).lower()
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "cpu":
        if device_input:
            raise UsageError("device arrays need the cuda backend (or copy them to the host)")
        from . import cpu

        return cpu
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    if name == "auto" and simulator and not device_input:
        from . import cpu

        return cpu
    return _numba_or_fallback(name, device_input)


def _numba_or_fallback(name: str, device_input: bool) -> ModuleType:
    """The Numba CUDA backend when it can run, else the CPU backend for "auto" (with a
    one-time note on stderr) or DeviceError."""
    global _warned_fallback
    problem = _cuda_problem()
    if problem is None:
        from . import cuda

        if device_input:
            _device_backend.append(cuda)  # the answer for device arrays from now on
        return cuda
    if name == "cuda" or device_input:
        raise DeviceError(f"--backend cuda: {problem}")
    if not _warned_fallback:
        print(f"imgfilter: {problem}; using the CPU backend", file=sys.stderr)
        _warned_fallback = True
    from . import cpu

    return cpu
