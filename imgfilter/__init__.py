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
    "gaussian",
    "gaussian_kernel",
    "gradient_magnitude",
    "laplacian",
    "scharr",
    "sharpen",
    "sobel",
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
    "blur_batch": "batch",
    "contour": "api",
    "contour_batch": "batch",
    "filter2d": "api",
    "filter2d_batch": "batch",
    "gaussian": "named",
    "gaussian_kernel": "named",
    "gradient_magnitude": "named",
    "laplacian": "named",
    "scharr": "named",
    "sharpen": "named",
    "sobel": "named",
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


__version__ = "0.1.0"
