"""Device functions shared by the kernels, compiled from the plain-Python sources.

`border_index`, `saturate_int`, `saturate_f32` and `bgr_to_gray` are written once in
plain Python (`kernels.common.border_index`, `kernels.common.saturate`,
`kernels.common.gray`) so the CPU backend and the tests use the very same code; here
they become CUDA device functions.
"""

from numba import cuda

from . import border_index as _bi
from . import gray as _gray
from . import saturate as _sat

border_index = cuda.jit(device=True)(_bi.border_index)
saturate_int = cuda.jit(device=True)(_sat.saturate_int)
saturate_f32 = cuda.jit(device=True)(_sat.saturate_f32)
bgr_to_gray = cuda.jit(device=True)(_gray.bgr_to_gray)
