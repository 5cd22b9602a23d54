"""Device code for imgfilter: Numba CUDA kernels and their launch functions.

Nothing here reads files, calls OpenCV or parses options: functions take and return
device arrays (or host arrays, which they copy to the device and back).
Submodules are imported on demand because importing numba.cuda is slow.

One package per operation (`box`, `conv`, `contour`, `softmax`, `linalg`) and the
classifier's kernels (`classify`), over `common` (launching, memory, the driver, and
the device code the kernels share), which imports none of them; operation packages
do not import each other (tests/test_layout.py). Within an operation: `plan` (launch
planning, free of Numba for box, conv and contour: the quick start uses it), the
kernels, and one entry point (`dispatch` for box, conv and softmax).
"""
