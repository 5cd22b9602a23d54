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

from .api import blur, contour, filter2d
from .errors import DeviceError, ImgFilterError, InputError, OutputError, UsageError
from .io import read_image, write_image

__all__ = [
    "blur",
    "contour",
    "filter2d",
    "read_image",
    "write_image",
    "ImgFilterError",
    "UsageError",
    "InputError",
    "OutputError",
    "DeviceError",
]
__version__ = "0.1.0"
