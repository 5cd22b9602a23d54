"""Telling device arrays from host arrays (Numba-free at import, so the app may ask too)."""

from __future__ import annotations

from typing import Any


def is_numba_device_array(obj: Any) -> bool:
    """Numba's own device arrays, including the simulator's (which lack the interface)."""
    return type(obj).__module__.startswith("numba.cuda") and hasattr(obj, "copy_to_host")


def is_device_array(obj: Any) -> bool:
    """True for GPU arrays: Numba's, or anything with `__cuda_array_interface__` (CuPy,
    torch CUDA tensors). Numba's check first: its interface builds a dict per access."""
    return is_numba_device_array(obj) or hasattr(obj, "__cuda_array_interface__")


def as_device_array(obj: Any):
    """A Numba view of a device array, without copying."""
    if is_numba_device_array(obj):
        return obj
    from numba import cuda

    return cuda.as_cuda_array(obj)


def start_address(obj: Any) -> int:
    """The address of a device array's first element (on the simulator, of the NumPy
    array it wraps: the offsets of views are the same)."""
    try:
        return int(obj.__cuda_array_interface__["data"][0])
    except AttributeError:
        return int(obj.__array_interface__["data"][0])


def whole_bytes(obj: Any) -> bool:
    """A C-contiguous uint8 Numba device array (not the simulator's): what the kernels'
    direct launches (`kernels.launch.core_launcher`) pass by address as it is."""
    try:
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
    except ImportError:  # Numba's simulator: no direct launches
        return False
    return isinstance(obj, DeviceNDArray) and obj.dtype == "uint8" and obj.is_c_contiguous()
