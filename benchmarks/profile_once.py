"""Run each fast kernel a few times on seed-size random data, for a profiler (GPU only).

ncu --clock-control none -k regex:'box_fused|contour_fused' python benchmarks/profile_once.py
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels import box as kbox
from kernels import contour as kcontour

img = np.random.default_rng(0).integers(0, 256, (2167, 2495, 3), dtype=np.uint8)
d_img = cuda.to_device(img)
d_gray = cuda.to_device(np.ascontiguousarray(img[:, :, 1:2]))
for _ in range(2):
    kbox.box_auto(d_img, (21, 21), (10, 10), 0, 0)
    kcontour.contour(d_gray, 0, 0)
cuda.synchronize()
