"""imgfilter: GPU image filtering that matches OpenCV.

    import imgfilter
    img = imgfilter.read_image("photo.jpg")
    out = imgfilter.blur(img, 21)                 # == cv2.blur(img, (21, 21))
    out = imgfilter.filter2d(img, kernel)         # == cv2.filter2D(img, -1, kernel)
    edges = imgfilter.contour(img)                # four 3x3 edge kernels, OR-merged
    imgfilter.write_image("out.png", out)

Backends: "cuda" (Numba CUDA kernels), "cpu" (Numba parallel CPU); "auto" picks cuda
when a usable GPU exists. Importing this package does not import Numba.
"""

import os as _os

from .errors import (
    DeviceError,
    GpuMemoryError,
    ImgFilterError,
    InputError,
    OutputError,
    UsageError,
)

__all__ = [
    "blur",
    "blur_batch",
    "contour",
    "contour_batch",
    "filter2d",
    "filter2d_batch",
    "read_image",
    "write_image",
    "set_gpu_pool_limit",
    "ImgFilterError",
    "UsageError",
    "InputError",
    "OutputError",
    "DeviceError",
    "GpuMemoryError",
]
_LAZY = {
    "blur": "api",
    "blur_batch": "api",
    "contour": "api",
    "contour_batch": "api",
    "filter2d": "api",
    "filter2d_batch": "api",
    "read_image": "io",
    "write_image": "io",
    "set_gpu_pool_limit": "api",
}


def __getattr__(name: str):
    # The array API and image I/O import NumPy (and OpenCV) on first use, so that the
    # CLI can start the GPU before paying for those imports (backends.warmup).
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _pixel_limit() -> int:
    """OpenCV decodes no image of more than 2**30 pixels unless OPENCV_IO_MAX_IMAGE_PIXELS
    says otherwise when it loads; large rasters are what imgfilter is for, so the limit
    becomes the host's memory in bytes (a pixel takes one at least), which still refuses
    a file that claims a size it could never hold."""
    try:
        memory = _os.sysconf("SC_PAGE_SIZE") * _os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        memory = 1 << 34
    return max(1 << 30, memory)


# OpenCV reads the variable when it loads: a cv2 imported before imgfilter keeps its limit.
_opencv_loaded_first = "cv2" in __import__("sys").modules
_os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(_pixel_limit()))

__version__ = "0.1.0"
